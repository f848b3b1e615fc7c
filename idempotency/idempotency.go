// Package idempotency is keyed's Idempotency-Key engine as net/http
// middleware over effects: one effect record per (tenant, key) holds the
// first response to a request, stored in the handler's own transaction, and
// replays it for a retry. The semantics, those of keyed's own API:
//
//   - the key is bound to the caller (Opts.Tenant): two tenants' "abc" are
//     two keys;
//   - a request is fingerprinted (RouteOpts.Fingerprint, by default the
//     route and the body's SHA-256); the same key with another fingerprint
//     is 422 idempotency_key_reused;
//   - a retry of a finished request gets the stored status, headers and
//     body byte for byte, with Idempotent-Replayed: true;
//   - a retry while the first request runs is 409 request_in_progress with
//     Retry-After, or, with Prefer: wait=N, waits up to N seconds for the
//     first request's response;
//   - a handler that answers without storing a response (a refusal, a
//     failure that wrote nothing) releases the key, so a retry runs at once;
//   - stored responses are kept for Retention (24 h) and then pruned
//     (Prune);
//   - the key may be sent bare (abc) or as an RFC 8941 string ("abc").
package idempotency

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
)

// Headers the middleware reads and writes.
const (
	// HeaderKey is required on every request through the middleware: 1 to
	// MaxKeyLen bytes of printable ASCII without spaces, chosen by the
	// client once per logical request and sent unchanged on every retry;
	// bare or as an RFC 8941 string ("abc" is the key abc).
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is "true" on a response replayed from the first
	// request with the same key.
	HeaderReplayed = "Idempotent-Replayed"
)

// Retention is how long a stored response stays replayable: 24 hours, as
// at Stripe. Prune never deletes a record younger than this.
const Retention = config.IdempotencyRetention

// Defaults of Opts.
const (
	// DefaultLease is how long a request holds its key before another
	// request may take it over. A holder that died blocks retries with 409
	// for at most this long.
	DefaultLease = 30 * time.Second
	// DefaultTimeout bounds a request's database work, from the claim to
	// the commit of its stored response.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxBodyBytes caps a body the default fingerprint reads.
	DefaultMaxBodyBytes = 1 << 20
	// ReleaseTimeout bounds the release of a key after a request that
	// stored nothing; it runs on a fresh context.
	ReleaseTimeout = time.Second
	// RetryAfterSeconds is the Retry-After of 409 request_in_progress: the
	// first request usually finishes in milliseconds.
	RetryAfterSeconds = 1
)

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = 255

// Kind is the effect kind of the records in keyed_effects. Their keys are
// "<tenant>:idempotency:<key>", or "<tenant>:idempotency-sha256:<hex>" for a
// key that holds ":" or would make the effect key too long.
const Kind = "api_request"

// MaxStoredBytes caps a stored response (status, headers and body, as
// JSON).
const MaxStoredBytes = 64 << 10

// Error codes the middleware answers with, in the "code" member of
// {"error":{"code":…,"field":…,"message":…}}.
const (
	CodeMissingKey        = "missing_idempotency_key" // 400
	CodeInvalidKey        = "invalid_idempotency_key" // 400: empty, over 255 bytes, bad characters, or malformed quoting
	CodeKeyReused         = "idempotency_key_reused"  // 422: the key was first used with another request
	CodeRequestInProgress = "request_in_progress"     // 409: the key's first request is still running; with Retry-After
	CodeBodyTooLarge      = "body_too_large"          // 413: the default fingerprint's body limit
	CodeInvalidRequest    = "invalid_request"         // 400: a fingerprint refused the request without saying how
	CodeUnavailable       = "unavailable"             // 503: the database is down or did not answer in time; with Retry-After
	CodeInternal          = "internal"                // 500
)

// Error is an error response: the HTTP status and the JSON body
// {"error":{"code":…,"field":…,"message":…}}. Field names the request member
// or header at fault, when there is one. A Fingerprint may return one to
// refuse a request before its key is claimed.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%d %s: %s: %s", e.Status, e.Code, e.Field, e.Message)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// NewError returns an *Error with a formatted message.
func NewError(status int, code, field, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// MaxEchoBytes bounds how much of a refused value an error quotes back.
const MaxEchoBytes = 64

// Echo quotes a value a client sent and the server refused, for an error
// message: cut to its first MaxEchoBytes bytes (then ending in "..."), so
// that an error never repeats a long input whole.
func Echo(s string) string {
	q, cut := EchoCut(s)
	if cut {
		return strconv.Quote(q) + "..."
	}
	return strconv.Quote(q)
}

// EchoCut returns s cut to at most MaxEchoBytes bytes at a rune's start,
// and whether it was cut: a refused value fit to stand in an error's field.
func EchoCut(s string) (string, bool) {
	if len(s) <= MaxEchoBytes {
		return s, false
	}
	cut := MaxEchoBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], true
}

// WriteError writes e as {"error":{…}}, the body of every error response
// (Opts.WriteError's default).
func WriteError(w http.ResponseWriter, e *Error) {
	if e.Status == http.StatusRequestTimeout {
		w.Header().Set("Connection", "close") // the rest of the body may still be on its way
	}
	body, _ := json.Marshal(struct {
		Error *Error `json:"error"`
	}{e})
	WriteJSON(w, e.Status, append(body, '\n'))
}

// WriteJSON writes status and a JSON body, with Content-Type
// application/json and X-Content-Type-Options: nosniff.
func WriteJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Unavailable reports whether err means the database could not serve the
// request now, so that a retry may succeed (503, not 500).
func Unavailable(err error) bool {
	return effects.IsInfrastructure(err)
}
