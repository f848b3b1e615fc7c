// Package fakestripe is an in-process fake of the Stripe PaymentIntents and
// Refunds APIs with Stripe's idempotency semantics, charge and refund
// counting and fault injection.
package fakestripe

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/keyedhq/keyed/internal/fakefault"
)

// Opts configures a Server. The zero value is usable.
type Opts struct {
	// APIKey, if set, is the only secret key accepted; otherwise any key
	// starting with "sk_" or "rk_" is.
	APIKey string
	// IdempotencyTTL is how long idempotent results are kept; 0 means 24h
	// like Stripe.
	IdempotencyTTL time.Duration
	// SearchLag hides payment intents from search for this long after
	// creation, like Stripe's eventually consistent search index (which
	// usually lags under a minute). 0 means immediately searchable.
	SearchLag time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// Server is a fake Stripe API. It implements http.Handler and is safe for
// concurrent use.
type Server struct {
	opts Opts
	mux  *http.ServeMux

	mu       sync.Mutex
	intents  map[string]*paymentIntent
	ordered  []*paymentIntent // in creation order
	idem     map[idemScope]*idemEntry
	faults   fakefault.Queue
	requests int
	charges  int
	byKey    map[string]int
	// refunds are in creation order; refunded sums them per payment intent.
	refunds     []*refund
	refundsByID map[string]*refund
	refunded    map[string]int64
	down        bool // SetOutage
}

// New returns a Server configured by opts, which may be nil.
func New(opts *Opts) *Server {
	s := &Server{mux: http.NewServeMux()}
	if opts != nil {
		s.opts = *opts
	}
	if s.opts.IdempotencyTTL == 0 {
		s.opts.IdempotencyTTL = 24 * time.Hour
	}
	if s.opts.Now == nil {
		s.opts.Now = time.Now
	}
	s.reset()
	s.mux.HandleFunc("POST /v1/payment_intents", s.authed(s.post(s.createPaymentIntent)))
	s.mux.HandleFunc("GET /v1/payment_intents/search", s.authed(s.search))
	s.mux.HandleFunc("GET /v1/payment_intents/{id}", s.authed(s.get))
	s.mux.HandleFunc("POST /v1/refunds", s.authed(s.post(s.createRefund)))
	s.mux.HandleFunc("GET /v1/refunds", s.authed(s.listRefunds))
	s.mux.HandleFunc("GET /v1/refunds/{id}", s.authed(s.getRefund))
	s.mux.HandleFunc("GET /v1/charges/{id}", s.authed(s.getCharge))
	s.mux.HandleFunc("/v1/", s.authed(func(w http.ResponseWriter, r *http.Request, _ string) {
		writeError(w, http.StatusNotFound, &apiError{Type: "invalid_request_error",
			Message: fmt.Sprintf("Unrecognized request URL (%s: %s).", r.Method, r.URL.Path)})
	}))
	fakefault.RegisterAdmin(s.mux, faultKinds, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Stats())
	}, s.Inject, s.Reset)
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		s.mu.Lock()
		s.requests++
		s.mu.Unlock()
		w.Header().Set("Request-Id", newID("req_"))
		if v := r.Header.Get("Stripe-Version"); v != "" {
			w.Header().Set("Stripe-Version", v)
		}
		if s.outage(w) {
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// Stats is a snapshot of the fake's counters, as served by GET /_fake/stats.
type Stats struct {
	// Charges is the number of successful charges actually performed.
	Charges int `json:"charges"`
	// Requests is the number of /v1 API requests received.
	Requests int `json:"requests"`
	// ByKey counts charges per Idempotency-Key.
	ByKey map[string]int `json:"by_key"`
	// PaymentIntents is the number of payment intents created, including
	// declined ones.
	PaymentIntents int `json:"payment_intents"`
	// Refunds is the number of refunds created.
	Refunds int `json:"refunds"`
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Charges: s.charges, Requests: s.requests, ByKey: make(map[string]int, len(s.byKey)), PaymentIntents: len(s.ordered), Refunds: len(s.refunds)}
	for k, v := range s.byKey {
		st.ByKey[k] = v
	}
	return st
}

// Charges returns the number of successful charges actually performed:
// confirmed payment intents that succeeded (or were authorized, with manual
// capture). Idempotent replays and declines are not charges.
func (s *Server) Charges() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.charges
}

// ChargesForKey returns the number of charges performed by requests carrying
// the Idempotency-Key idemKey (under any API key).
func (s *Server) ChargesForKey(idemKey string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byKey[idemKey]
}

// ChargesForMetadata returns the number of charges whose payment intent has
// metadata key set to value.
func (s *Server) ChargesForMetadata(key, value string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, pi := range s.ordered {
		if v, ok := pi.Metadata[key]; pi.charged && ok && v == value {
			n++
		}
	}
	return n
}

// Requests returns the number of /v1 API requests received, including
// replays and failed ones.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Reset forgets all payment intents, refunds, idempotency keys, counters and
// queued faults.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset()
}

func (s *Server) reset() {
	s.intents = map[string]*paymentIntent{}
	s.ordered = nil
	s.idem = map[idemScope]*idemEntry{}
	s.faults.Reset()
	s.requests, s.charges = 0, 0
	s.byKey = map[string]int{}
	s.refunds, s.refundsByID, s.refunded = nil, map[string]*refund{}, map[string]int64{}
	s.down = false
}

// authed wraps h with Stripe's API key check and passes the key on.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			key, _, ok = r.BasicAuth()
		}
		key = strings.TrimSpace(key)
		switch {
		case !ok || key == "":
			writeError(w, http.StatusUnauthorized, &apiError{Type: "invalid_request_error",
				Message: "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY')."})
		case s.opts.APIKey != "" && key != s.opts.APIKey,
			s.opts.APIKey == "" && !strings.HasPrefix(key, "sk_") && !strings.HasPrefix(key, "rk_"):
			writeError(w, http.StatusUnauthorized, &apiError{Type: "invalid_request_error", Code: "api_key_invalid",
				Message: "Invalid API Key provided: " + redact(key)})
		default:
			h(w, r, key)
		}
	}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, _ string) {
	id := r.PathValue("id")
	s.mu.Lock()
	pi := s.intents[id]
	s.mu.Unlock()
	if pi == nil {
		writeError(w, http.StatusNotFound, &apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "intent",
			Message: fmt.Sprintf("No such payment_intent: '%s'", id)})
		return
	}
	writeJSON(w, http.StatusOK, s.render(pi, expansions(r.URL.Query())))
}

// apiError is the body of Stripe's {"error": {...}} envelope.
type apiError struct {
	Type          string         `json:"type"`
	Code          string         `json:"code,omitempty"`
	DeclineCode   string         `json:"decline_code,omitempty"`
	Message       string         `json:"message"`
	Param         string         `json:"param,omitempty"`
	Charge        string         `json:"charge,omitempty"`
	DocURL        string         `json:"doc_url,omitempty"`
	PaymentIntent *paymentIntent `json:"payment_intent,omitempty"`
}

// withDoc sets e.DocURL from e.Code, as Stripe does, and returns e.
func withDoc(e *apiError) *apiError {
	if e.Code != "" && e.DocURL == "" {
		e.DocURL = "https://stripe.com/docs/error-codes/" + strings.ReplaceAll(e.Code, "_", "-")
	}
	return e
}

// errorBody renders e in Stripe's error envelope, or returns nil for nil.
func errorBody(e *apiError) []byte {
	if e == nil {
		return nil
	}
	return mustJSON(map[string]*apiError{"error": withDoc(e)})
}

func writeError(w http.ResponseWriter, status int, e *apiError) {
	writeRaw(w, status, errorBody(e))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeRaw(w, status, mustJSON(v))
}

// mustJSON marshals v, which is always one of this package's plain types.
func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

func redact(key string) string {
	if len(key) <= 12 {
		return strings.Repeat("*", len(key))
	}
	return key[:8] + strings.Repeat("*", len(key)-12) + key[len(key)-4:]
}

const idAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newID returns prefix followed by 24 random alphanumerics, like Stripe IDs.
func newID(prefix string) string {
	b := make([]byte, 24)
	rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return prefix + string(b)
}
