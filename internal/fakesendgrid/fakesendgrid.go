// Package fakesendgrid is an in-process fake of SendGrid's v3 mail send API
// and of its Email Activity API (GET /v3/messages, see activity.go) that
// records accepted messages and supports fault injection. Like SendGrid it
// has no idempotency: every accepted request is a new send. Like SendGrid's
// activity index, the look-up shows a message only some time (Opts.IndexLag)
// after it was accepted.
package fakesendgrid

import (
	"cmp"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/mail"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keyedhq/keyed/internal/fakefault"
)

// Opts configures a Server. The zero value is usable.
type Opts struct {
	// APIKey, if set, is the only API key accepted; otherwise any non-empty
	// bearer token is.
	APIKey string
	// IndexLag is how long an accepted message stays invisible to the Email
	// Activity API, like SendGrid's indexing delay. Zero means at once.
	IndexLag time.Duration
	// NoActivityAccess refuses every Email Activity request with 403, like
	// SendGrid for an API key without the Email Activity scope.
	NoActivityAccess bool
}

// Message is one accepted email: one personalization of a mail send request,
// with top-level fields merged in.
type Message struct {
	// MessageID is the X-Message-Id of the request that sent the message.
	MessageID    string            `json:"message_id"`
	From         string            `json:"from"`
	To           []string          `json:"to"`
	Subject      string            `json:"subject,omitempty"`
	TemplateID   string            `json:"template_id,omitempty"`
	TemplateData map[string]any    `json:"template_data,omitempty"`
	CustomArgs   map[string]string `json:"custom_args,omitempty"`
	Headers      map[string]string `json:"headers,omitempty"`
	// Body is the text/plain content, or the text/html one if there is no
	// plain text.
	Body string `json:"body,omitempty"`
}

// Stats is a snapshot of the fake's counters, as served by GET /_fake/stats.
type Stats struct {
	// Count is the number of accepted messages.
	Count int `json:"count"`
	// Requests is the number of /v3 API requests received.
	Requests int `json:"requests"`
	// Lookups is the number of Email Activity requests received.
	Lookups int `json:"lookups"`
	// ByEffectKey counts accepted messages per "effect_key" custom arg.
	ByEffectKey map[string]int `json:"by_effect_key"`
}

// Server is a fake SendGrid API. It implements http.Handler and is safe for
// concurrent use.
type Server struct {
	opts Opts
	mux  *http.ServeMux

	mu       sync.Mutex
	messages []Message
	accepted []time.Time // accepted[i] is when messages[i] was accepted.
	faults   fakefault.Queue
	requests int

	lookupFaults fakefault.Queue
	lookupDown   bool
	lookups      int
}

// New returns a Server configured by opts, which may be nil.
func New(opts *Opts) *Server {
	s := &Server{mux: http.NewServeMux()}
	if opts != nil {
		s.opts = *opts
	}
	s.mux.HandleFunc("POST /v3/mail/send", s.authed(s.send))
	s.mux.HandleFunc("GET /v3/messages", s.authed(s.activity))
	s.mux.HandleFunc("/v3/", s.authed(func(w http.ResponseWriter, _ *http.Request) {
		writeErrors(w, http.StatusNotFound, apiError{Message: "resource not found"})
	}))
	fakefault.RegisterAdmin(s.mux, faultKinds, func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Stats())
	}, s.Inject, s.Reset)
	s.mux.HandleFunc("GET /_fake/messages", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Messages())
	})
	s.activityAdmin(s.mux)
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v3/") {
		s.mu.Lock()
		s.requests++
		s.mu.Unlock()
	}
	s.mux.ServeHTTP(w, r)
}

// Messages returns a copy of all accepted messages in acceptance order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.messages...)
}

// MessagesFor returns the accepted messages whose custom arg key is value.
func (s *Server) MessagesFor(customArgKey, value string) []Message {
	var out []Message
	for _, m := range s.Messages() {
		if v, ok := m.CustomArgs[customArgKey]; ok && v == value {
			out = append(out, m)
		}
	}
	return out
}

// Count returns the number of accepted messages.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.messages)
}

// Requests returns the number of /v3 API requests received, including
// failed ones.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Count: len(s.messages), Requests: s.requests, Lookups: s.lookups, ByEffectKey: map[string]int{}}
	for _, m := range s.messages {
		if k, ok := m.CustomArgs["effect_key"]; ok {
			st.ByEffectKey[k]++
		}
	}
	return st
}

// Reset forgets all messages, counters and queued faults, and ends a look-up
// outage. The index lag stays.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.messages, s.accepted, s.requests = nil, nil, 0
	s.lookups, s.lookupDown = 0, false
	s.faults.Reset()
	s.lookupFaults.Reset()
}

// authed wraps h with SendGrid's bearer API key check.
func (s *Server) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch key = strings.TrimSpace(key); {
		case !ok || key == "":
			writeErrors(w, http.StatusUnauthorized, apiError{Message: "authorization required"})
		case s.opts.APIKey != "" && key != s.opts.APIKey:
			writeErrors(w, http.StatusUnauthorized, apiError{Message: "The provided authorization grant is invalid, expired, or revoked"})
		default:
			h(w, r)
		}
	}
}

type address struct {
	Email string `json:"email"`
	Name  string `json:"name"`
}

type personalization struct {
	To                  []address         `json:"to"`
	From                *address          `json:"from"`
	Subject             string            `json:"subject"`
	Headers             map[string]string `json:"headers"`
	CustomArgs          map[string]string `json:"custom_args"`
	DynamicTemplateData map[string]any    `json:"dynamic_template_data"`
}

// mailRequest is the subset of the v3 mail send body that the fake reads.
type mailRequest struct {
	Personalizations []personalization `json:"personalizations"`
	From             *address          `json:"from"`
	Subject          string            `json:"subject"`
	Content          []struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	} `json:"content"`
	TemplateID string            `json:"template_id"`
	Headers    map[string]string `json:"headers"`
	CustomArgs map[string]string `json:"custom_args"`
}

func (s *Server) send(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeErrors(w, http.StatusBadRequest, apiError{Message: "Bad Request"})
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		writeErrors(w, http.StatusBadRequest, apiError{Message: "Bad Request"})
		return
	}
	fault, _ := s.faults.Take(string(raw))
	time.Sleep(fault.Delay)
	switch fault.Kind {
	case FaultServerError:
		writeErrors(w, http.StatusInternalServerError, apiError{Message: "internal server error"})
		return
	case FaultRateLimit:
		w.Header().Set("X-RateLimit-Limit", "600")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Unix()+1, 10))
		writeErrors(w, http.StatusTooManyRequests, apiError{Message: "too many requests"})
		return
	}

	var req mailRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		writeErrors(w, http.StatusBadRequest, apiError{Message: "Bad Request"})
		return
	}
	msgs, errs := build(&req)
	if len(errs) > 0 {
		writeErrors(w, http.StatusBadRequest, errs...)
		return
	}
	id := newMessageID()
	now := time.Now()
	s.mu.Lock()
	for _, m := range msgs {
		m.MessageID = id
		s.messages = append(s.messages, m)
		s.accepted = append(s.accepted, now)
	}
	s.mu.Unlock()
	if fault.Kind == FaultDropResponse {
		fakefault.DropConnection(w)
		return
	}
	w.Header().Set("X-Message-Id", id)
	w.WriteHeader(http.StatusAccepted)
}

// build validates req like SendGrid does and returns one Message per
// personalization, or all validation errors.
func build(req *mailRequest) ([]Message, []apiError) {
	var errs []apiError
	fail := func(field, msg string) {
		errs = append(errs, apiError{Field: &field, Message: msg,
			Help: "http://sendgrid.com/docs/API_Reference/Web_API_v3/Mail/errors.html#message." + field})
	}
	if len(req.Personalizations) == 0 {
		fail("personalizations", "The personalizations field is required and must have at least one personalization.")
	}
	bodyText := ""
	for _, c := range req.Content {
		if c.Type == "text/plain" || bodyText == "" && c.Type == "text/html" {
			bodyText = c.Value
		}
	}
	if req.TemplateID == "" && len(req.Content) == 0 {
		fail("content", "Unless a valid template_id is provided, the content parameter is required. There must be at least one defined content block. We typically suggest both text/plain and text/html blocks are included, but only one block is required.")
	}
	if req.From != nil && !valid(req.From.Email) {
		fail("from.email", "The from email does not contain a valid address.")
	}
	subjectMissing, fromMissing := false, req.From == nil && len(req.Personalizations) == 0
	var msgs []Message
	for i, p := range req.Personalizations {
		m := Message{From: p.fromOr(req.From), Subject: cmp.Or(p.Subject, req.Subject), TemplateID: req.TemplateID,
			TemplateData: p.DynamicTemplateData, Body: bodyText,
			CustomArgs: merge(req.CustomArgs, p.CustomArgs), Headers: merge(req.Headers, p.Headers)}
		if len(p.To) == 0 {
			fail(fmt.Sprintf("personalizations.%d.to", i), "The to array is required for all personalization objects, and must have at least one email object with a valid email address.")
		}
		for j, to := range p.To {
			if !valid(to.Email) {
				fail(fmt.Sprintf("personalizations.%d.to.%d.email", i, j), "Does not contain a valid address.")
			}
			m.To = append(m.To, to.Email)
		}
		if p.From != nil && !valid(p.From.Email) {
			fail(fmt.Sprintf("personalizations.%d.from.email", i), "The from email does not contain a valid address.")
		}
		fromMissing = fromMissing || p.From == nil && req.From == nil
		subjectMissing = subjectMissing || m.Subject == ""
		msgs = append(msgs, m)
	}
	if fromMissing {
		fail("from", `The from object must be provided for every email send. It is an object that requires the email parameter, but may also contain a name parameter.  e.g. {"email" : "example@example.com"}  or {"email" : "example@example.com", "name" : "Example Recipient"}.`)
	}
	if subjectMissing && req.TemplateID == "" {
		fail("subject", "The subject is required. You can get around this requirement if you use a template with a subject defined or if every personalization has a subject defined.")
	}
	return msgs, errs
}

func (p personalization) fromOr(def *address) string {
	switch {
	case p.From != nil:
		return p.From.Email
	case def != nil:
		return def.Email
	}
	return ""
}

func valid(addr string) bool {
	a, err := mail.ParseAddress(addr)
	return err == nil && a.Address == addr
}

// merge returns base overlaid with over, or nil if both are empty.
func merge(base, over map[string]string) map[string]string {
	if len(base)+len(over) == 0 {
		return nil
	}
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, over)
	return out
}

// apiError is one entry of SendGrid's {"errors": [...]} body.
type apiError struct {
	Message string  `json:"message"`
	Field   *string `json:"field"`
	Help    any     `json:"help"`
}

func writeErrors(w http.ResponseWriter, status int, errs ...apiError) {
	writeJSON(w, status, map[string][]apiError{"errors": errs})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// newMessageID returns a random 22 character ID like SendGrid's X-Message-Id.
func newMessageID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
