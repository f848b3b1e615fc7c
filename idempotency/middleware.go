package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
)

// Opts configures a Middleware. Tenant is required.
type Opts struct {
	// Tenant returns the authenticated caller of r, to whom its key is
	// bound. Required: put the middleware behind authentication. An empty
	// tenant is answered 500 internal.
	Tenant func(r *http.Request) string
	// Lease is how long a request holds its key. Zero means DefaultLease.
	// It must exceed Timeout plus the longest the handler waits on
	// anything else (MaxWait for a handler that honours Prefer: wait).
	Lease time.Duration
	// Timeout bounds each claim of the key, and then the handler's work:
	// the handler's r.Context() carries a deadline of Timeout from the
	// claim and is not cancelled when the client goes away, so that a retry
	// finds the response stored. Zero means DefaultTimeout.
	Timeout time.Duration
	// MaxWait bounds how long a request with Prefer: wait=N waits for the
	// response of the same key's request in flight, instead of 409. Zero
	// means it does not wait.
	MaxWait time.Duration
	// Owner, if set, names the request in the record's owner (a request ID,
	// for the logs); a random suffix is added.
	Owner func(r *http.Request) string
	// Observe, if set, is told each request's outcome: "new", "takeover"
	// (the key's holder had died), "replayed", "key_reused", "in_progress".
	Observe func(outcome string)
	// WriteError writes the middleware's error responses. Nil means
	// WriteError.
	WriteError func(w http.ResponseWriter, r *http.Request, e *Error)
	// Logger receives failures (never a key's response). Nil means
	// slog.Default().
	Logger *slog.Logger
}

// RouteOpts configures one route of a Middleware. A nil *RouteOpts means
// the defaults.
type RouteOpts struct {
	// Fingerprint reads and checks the request and returns its fingerprint
	// (the same key with another one is 422) and a value the handler gets
	// from Request.Value. An *Error refuses the request before its key is
	// claimed; any other error is 400 invalid_request. Nil means the
	// method, route pattern and SHA-256 of the body (at most
	// DefaultMaxBodyBytes), with the body as the value; the handler reads
	// r.Body as usual.
	Fingerprint func(w http.ResponseWriter, r *http.Request) (fingerprint string, v any, err error)
	// Replay renders the body of a stored response from what it kept
	// (Response.Kept) and the value of the retry's Fingerprint. Required
	// for a route whose responses set Kept.
	Replay func(v any, kept json.RawMessage) ([]byte, error)
}

// Middleware gives handlers Idempotency-Key semantics (see the package
// documentation). It is safe for concurrent use.
type Middleware struct {
	store    *store
	opts     Opts
	lease    time.Duration
	timeout  time.Duration
	logger   *slog.Logger
	writeErr func(w http.ResponseWriter, r *http.Request, e *Error)
}

// New returns a Middleware over db, which must have keyed's migrations
// applied. It returns an error if db or opts.Tenant is nil or a duration is
// out of range.
func New(db effects.DB, opts *Opts) (*Middleware, error) {
	if db == nil {
		return nil, errors.New("idempotency: New: db is nil")
	}
	if opts == nil || opts.Tenant == nil {
		return nil, errors.New("idempotency: New: Opts.Tenant is required")
	}
	m := &Middleware{opts: *opts, lease: opts.Lease, timeout: opts.Timeout, logger: opts.Logger, writeErr: opts.WriteError}
	if m.lease == 0 {
		m.lease = DefaultLease
	}
	if m.timeout == 0 {
		m.timeout = DefaultTimeout
	}
	switch {
	case m.timeout < 0 || m.opts.MaxWait < 0:
		return nil, fmt.Errorf("idempotency: New: timeout %s or max wait %s is negative", m.timeout, m.opts.MaxWait)
	case m.lease <= m.timeout+m.opts.MaxWait:
		return nil, fmt.Errorf("idempotency: New: lease %s must exceed the timeout %s plus the max wait %s", m.lease, m.timeout, m.opts.MaxWait)
	}
	if m.logger == nil {
		m.logger = slog.Default()
	}
	if m.writeErr == nil {
		m.writeErr = func(w http.ResponseWriter, _ *http.Request, e *Error) { WriteError(w, e) }
	}
	// No metrics of its own (a client's 422 is no fingerprint mismatch to
	// page on) and warnings only: the access log has a record per request.
	claims, err := effects.NewClient(db, &effects.ClientOpts{Logger: slog.New(warnOnly{m.logger.Handler()})})
	if err != nil {
		return nil, fmt.Errorf("idempotency: New: %w", err)
	}
	m.store = &store{claims: claims, lease: m.lease}
	return m, nil
}

// Wrap is Route(next, nil).
func (m *Middleware) Wrap(next http.Handler) http.Handler { return m.Route(next, nil) }

// Route returns next behind the key: a request without a valid key is 400,
// a replay answers the stored response, another fingerprint 422, a request
// in flight 409; otherwise next runs with the Request in its context
// (FromContext) and stores its response with Request.CompleteTx in its own
// transaction. GET, HEAD and OPTIONS pass through untouched.
func (m *Middleware) Route(next http.Handler, ro *RouteOpts) http.Handler {
	if ro == nil {
		ro = &RouteOpts{}
	}
	fingerprint := ro.Fingerprint
	if fingerprint == nil {
		fingerprint = bodyFingerprint
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			next.ServeHTTP(w, r)
			return
		}
		key, aerr := keyOf(r)
		if aerr != nil {
			m.writeErr(w, r, aerr)
			return
		}
		tenant := m.opts.Tenant(r)
		if tenant == "" {
			m.logger.ErrorContext(r.Context(), "idempotency middleware: no tenant; put it behind authentication")
			m.writeErr(w, r, NewError(http.StatusInternalServerError, CodeInternal, "", "the server failed"))
			return
		}
		fp, v, err := fingerprint(w, r)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				e = NewError(http.StatusBadRequest, CodeInvalidRequest, "", "%v", err)
			}
			m.writeErr(w, r, e)
			return
		}
		q := &Request{m: m, ro: ro, key: key, tenant: tenant, value: v, owner: randomID(6)}
		if m.opts.Owner != nil {
			q.owner = m.opts.Owner(r) + "/" + q.owner
		}
		if q.stored, err = StoredKey(tenant, key); err != nil {
			m.Fail(w, r, "claim idempotency key", err)
			return
		}
		prev, ok := m.claim(w, r, q, fp)
		if !ok {
			return
		}
		if prev != nil {
			m.replay(w, r, ro, v, prev)
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.timeout)
		defer cancel()
		sw := &StatusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(ctx, requestKey{}, q)))
		if q.keep || (q.completed != nil && sw.Status == q.completed.Status) {
			return
		}
		// Nothing stored, or stored in a transaction that did not commit.
		m.release(ctx, q)
	})
}

// claim claims q's key, waiting for a request in flight as long as r's
// Prefer: wait allows (up to MaxWait). It returns the stored response of a
// finished request, or ok=false once it answered the request itself.
func (m *Middleware) claim(w http.ResponseWriter, r *http.Request, q *Request, fp string) (prev *stored, ok bool) {
	var until time.Time
	if wait, ok := PreferredWait(r, m.opts.MaxWait); ok {
		until = time.Now().Add(wait)
	}
	pause := 20 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.timeout)
		cl, prev, err := m.store.claim(ctx, q.stored, fp, q.owner)
		cancel()
		switch {
		case errors.Is(err, errKeyReused):
			m.observe("key_reused")
			m.writeErr(w, r, NewError(http.StatusUnprocessableEntity, CodeKeyReused, HeaderKey,
				"Idempotency-Key %s was first used with a different request (another route or body); use a new key for a new request", Echo(q.key)))
			return nil, false
		case errors.Is(err, errInProgress) && time.Now().Add(pause).Before(until) && r.Context().Err() == nil:
			time.Sleep(pause)
			pause = min(2*pause, 250*time.Millisecond)
			continue
		case errors.Is(err, errInProgress):
			m.observe("in_progress")
			w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
			m.writeErr(w, r, NewError(http.StatusConflict, CodeRequestInProgress, HeaderKey,
				"a request with Idempotency-Key %s is still running; retry after %d s", Echo(q.key), RetryAfterSeconds))
			return nil, false
		case err != nil:
			m.release(r.Context(), q)
			m.Fail(w, r, "claim idempotency key", err)
			return nil, false
		case prev != nil:
			return prev, true
		case cl.Mode == effects.ModeTakeover:
			m.observe("takeover")
		default:
			m.observe("new")
		}
		q.claim = cl
		return nil, true
	}
}

// replay answers prev, the stored response, byte for byte.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, ro *RouteOpts, v any, prev *stored) {
	var body []byte
	var err error
	if len(prev.Body) > 0 && prev.Body[0] == '"' {
		var s string
		err = json.Unmarshal(prev.Body, &s)
		body = []byte(s)
	} else if ro.Replay == nil {
		err = errors.New("the route has no Replay for what its record keeps")
	} else {
		body, err = ro.Replay(v, prev.Body)
	}
	if err != nil {
		m.Fail(w, r, "replay stored response", err)
		return
	}
	m.observe("replayed")
	for k, v := range prev.Header {
		w.Header().Set(k, v)
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set(HeaderReplayed, "true")
	w.WriteHeader(prev.Status)
	_, _ = w.Write(body)
}

// release frees q's claim on a fresh context bounded by ReleaseTimeout. A
// failed release is logged; the key then frees when its lease ends.
func (m *Middleware) release(ctx context.Context, q *Request) {
	if q.stored.IsZero() {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
	defer cancel()
	if err := m.store.release(rctx, q.stored, q.owner, q.claim); err != nil {
		m.logger.WarnContext(rctx, "release idempotency key; it frees when its lease runs out", "error", err)
	}
}

// Fail logs err and answers without revealing it: 409 request_in_progress
// with Retry-After for ErrLeaseLost (the request outlived its hold and was
// undone), 503 unavailable with Retry-After when the database is down or did
// not answer in time, else 500 internal. what names the work, such as
// "create order".
func (m *Middleware) Fail(w http.ResponseWriter, r *http.Request, what string, err error) {
	switch {
	case errors.Is(err, ErrLeaseLost):
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		key := ""
		if q := FromContext(r.Context()); q != nil {
			key = q.key
		}
		m.writeErr(w, r, NewError(http.StatusConflict, CodeRequestInProgress, HeaderKey,
			"this request outlived its hold on Idempotency-Key %s and was undone; retry after %d s", Echo(key), RetryAfterSeconds))
		return
	case Unavailable(err):
		m.logger.ErrorContext(r.Context(), what, "error", err)
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterSeconds))
		m.writeErr(w, r, NewError(http.StatusServiceUnavailable, CodeUnavailable, "",
			"%s: the database is unavailable; retry (with the same Idempotency-Key for a POST)", what))
		return
	}
	m.logger.ErrorContext(r.Context(), what, "error", err)
	m.writeErr(w, r, NewError(http.StatusInternalServerError, CodeInternal, "", "%s failed; retry (with the same Idempotency-Key for a POST)", what))
}

// Prune deletes the expired records; see Prune.
func (m *Middleware) Prune(ctx context.Context) (int64, error) {
	return prune(ctx, m.store.claims, nil)
}

func (m *Middleware) observe(outcome string) {
	if m.opts.Observe != nil {
		m.opts.Observe(outcome)
	}
}

// Response is a response a handler stores under its request's key and
// sends: Write sends it as stored.
type Response struct {
	Status int
	// Header holds the headers stored and replayed with the response, such
	// as Location; one value each. Content-Type defaults to
	// application/json.
	Header http.Header
	// Body is the body sent. It must be UTF-8 unless Kept is set.
	Body []byte
	// Kept, if set, is stored in place of Body (a JSON value, such as an
	// outcome without the request's personal data), and the route's Replay
	// renders the body from it; CompleteTx checks that it renders Body
	// byte for byte.
	Kept json.RawMessage
}

// JSON returns a Response of status with v as its JSON body and a newline.
func JSON(status int, v any) (Response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return Response{}, fmt.Errorf("encode response: %w", err)
	}
	return Response{Status: status, Body: append(body, '\n')}, nil
}

// Write sends resp: its headers, Content-Type application/json unless
// set, X-Content-Type-Options: nosniff, its status and body.
func (resp Response) Write(w http.ResponseWriter) {
	for k, vs := range resp.Header {
		if len(vs) > 0 {
			w.Header().Set(k, vs[0])
		}
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// Request is a request's hold on its key, in its handler's context.
type Request struct {
	m      *Middleware
	ro     *RouteOpts
	key    string
	tenant string
	value  any
	owner  string
	stored effects.Key
	claim  *effects.Claim
	// completed is the response CompleteTx stored; keep says the handler
	// committed writes without one (Keep).
	completed *stored
	keep      bool
}

type requestKey struct{}

// FromContext returns the Request of a handler behind the middleware, or
// nil.
func FromContext(ctx context.Context) *Request {
	q, _ := ctx.Value(requestKey{}).(*Request)
	return q
}

// Key returns the client's key, unquoted.
func (q *Request) Key() string { return q.key }

// Tenant returns the caller the key is bound to.
func (q *Request) Tenant() string { return q.tenant }

// Value returns what the route's Fingerprint returned with the
// fingerprint: the decoded request, or the body by default.
func (q *Request) Value() any { return q.value }

// TookOver reports whether the request took the key over from a holder
// whose lease ran out (it died, or outlived its hold), whose writes may
// have committed.
func (q *Request) TookOver() bool { return q.claim != nil && q.claim.Mode == effects.ModeTakeover }

// CompleteTx stores resp as the key's response in tx, the transaction of
// the request's writes, so that both commit or neither does; then send it
// with resp.Write. It returns ErrLeaseLost if another request took the key
// over (roll back, and answer with Middleware.Fail), ErrNotRendered for a
// Kept that does not render Body, and the database error.
func (q *Request) CompleteTx(ctx context.Context, tx pgx.Tx, resp Response) error {
	if q.completed != nil {
		return ErrCompleted
	}
	if resp.Kept != nil {
		if q.ro.Replay == nil {
			return errors.New("store response: Kept is set but the route has no Replay")
		}
		got, err := q.ro.Replay(q.value, resp.Kept)
		if err != nil {
			return fmt.Errorf("store response: %w", err)
		}
		if !bytes.Equal(got, resp.Body) {
			return ErrNotRendered
		}
	}
	st, err := encode(resp)
	if err != nil {
		return err
	}
	if err := q.m.store.completeTx(ctx, tx, q.claim, st); err != nil {
		return err
	}
	q.completed = &st
	return nil
}

// Complete is CompleteTx in a transaction of its own on db, for a
// response decided after the request's writes committed (see Keep).
func (q *Request) Complete(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, resp Response) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return q.CompleteTx(ctx, tx, resp) })
}

// Keep says the request's writes committed before its response is stored
// (Complete): the key is not released if the handler then fails, and a
// retry takes it over once the lease ends.
func (q *Request) Keep() { q.keep = true }

// keyOf returns r's key, parsed by ParseKey, or a 400:
// missing_idempotency_key when there is none, invalid_idempotency_key when
// there are several or the one is malformed.
func keyOf(r *http.Request) (string, *Error) {
	vals := r.Header.Values(HeaderKey)
	if len(vals) == 0 {
		return "", NewError(http.StatusBadRequest, CodeMissingKey, HeaderKey,
			"POST needs an Idempotency-Key header: a unique value per logical request, sent unchanged on every retry")
	}
	if len(vals) > 1 {
		return "", NewError(http.StatusBadRequest, CodeInvalidKey, HeaderKey, "send one Idempotency-Key header, not %d", len(vals))
	}
	key, problem := ParseKey(vals[0])
	if problem != "" {
		return "", NewError(http.StatusBadRequest, CodeInvalidKey, HeaderKey, "Idempotency-Key %s", problem)
	}
	return key, nil
}

// bodyFingerprint is the default Fingerprint: the method, the route
// pattern and the body's SHA-256; the body is the value, and r.Body is
// reset to read it again.
func bodyFingerprint(w http.ResponseWriter, r *http.Request) (string, any, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, DefaultMaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return "", nil, NewError(http.StatusRequestEntityTooLarge, CodeBodyTooLarge, "", "the body is over the %d-byte limit", DefaultMaxBodyBytes)
		}
		return "", nil, NewError(http.StatusBadRequest, CodeInvalidRequest, "", "the body could not be read in full")
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	h := sha256.New()
	_, _ = io.WriteString(h, r.Method+" "+r.Pattern+"\x00")
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil)), body, nil
}

// StatusWriter records the status written through it in Status (zero
// until a header or body is written), for middleware around a handler.
type StatusWriter struct {
	http.ResponseWriter
	Status int
}

// WriteHeader records code, the first time, and writes it.
func (w *StatusWriter) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write records 200 if no status was written, and writes b.
func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// randomID returns 2n random lowercase letters and digits (n at most 13).
func randomID(n int) string {
	return strings.ToLower(rand.Text())[:2*n]
}
