package fakesendgrid

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/keyedhq/keyed/internal/fakefault"
)

// The Email Activity API ("Filter all messages", GET /v3/messages) as the
// fake models it:
//
//   - Authorization is the same bearer API key as mail send. With
//     Opts.NoActivityAccess every key is refused with 403, as SendGrid does
//     for a key without the Email Activity scope or an account without the
//     add-on.
//   - limit is 1 to 1000, default 10; anything else is a 400 on "limit".
//   - query is SendGrid's query language restricted to what keyed uses:
//     conditions joined by AND, optionally parenthesised, each
//     field="value" or field!="value", where field is msg_id, from_email,
//     to_email, subject, status, template_id or unique_args['name'] (a custom
//     argument). Values are double-quoted; \" and \\ escape. Anything else is
//     a 400 on "query". No query lists the most recent messages.
//   - The answer is {"messages":[...]}, most recent first, with msg_id,
//     from_email, to_email, subject, status ("processed"), opens_count,
//     clicks_count and last_event_time, one entry per recipient.
//   - A message becomes visible only Opts.IndexLag after it was accepted.

// ActivityMessage is one entry of the Email Activity API's answer (SendGrid's
// "abbreviated message").
type ActivityMessage struct {
	// MsgID is SendGrid's full message ID: the X-Message-Id of the send
	// request, a dot, and a per-recipient suffix.
	MsgID         string `json:"msg_id"`
	FromEmail     string `json:"from_email"`
	ToEmail       string `json:"to_email"`
	Subject       string `json:"subject"`
	Status        string `json:"status"`
	OpensCount    int    `json:"opens_count"`
	ClicksCount   int    `json:"clicks_count"`
	LastEventTime string `json:"last_event_time"`
}

// activityFaultKinds lists the fault kinds the look-up endpoint implements.
var activityFaultKinds = []FaultKind{FaultDropResponse, FaultServerError, FaultRateLimit, FaultLatency}

// InjectLookup queues f for the next f.Times matching Email Activity
// requests (GET /v3/messages); 0 means 1. If f.Match is set, only requests
// whose decoded query parameter contains it match, for example an effect
// key. FaultServerError answers 500, FaultRateLimit 429, FaultDropResponse
// closes the connection without an answer, and every kind first sleeps
// f.Delay. Look-up faults are queued apart from mail send faults.
func (s *Server) InjectLookup(f Fault) {
	s.lookupFaults.Inject(f)
}

// SetLookupOutage turns an outage of the Email Activity API on or off: while
// on, every look-up is answered 503 (mail send is unaffected).
func (s *Server) SetLookupOutage(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookupDown = on
}

// SetIndexLag changes how long an accepted message stays invisible to the
// Email Activity API. It applies to messages already accepted too.
func (s *Server) SetIndexLag(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.IndexLag = d
}

// Lookups returns the number of Email Activity requests received, including
// failed ones.
func (s *Server) Lookups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups
}

// Indexed returns the accepted messages whose custom arg key is value and
// that the Email Activity API shows now, that is, accepted at least IndexLag
// ago.
func (s *Server) Indexed(customArgKey, value string) []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Message
	for i, m := range s.messages {
		if v, ok := m.CustomArgs[customArgKey]; ok && v == value && s.visible(i, time.Now()) {
			out = append(out, m)
		}
	}
	return out
}

// visible reports whether message i is in the index at now. s.mu is held.
func (s *Server) visible(i int, now time.Time) bool {
	return !now.Before(s.accepted[i].Add(s.opts.IndexLag))
}

func (s *Server) activity(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.lookups++
	down, noAccess := s.lookupDown, s.opts.NoActivityAccess
	s.mu.Unlock()
	q := r.URL.Query()
	fault, _ := s.lookupFaults.Take(q.Get("query"))
	time.Sleep(fault.Delay)
	switch {
	case fault.Kind == FaultDropResponse:
		fakefault.DropConnection(w)
		return
	case fault.Kind == FaultServerError:
		writeErrors(w, http.StatusInternalServerError, apiError{Message: "internal server error"})
		return
	case fault.Kind == FaultRateLimit:
		w.Header().Set("X-RateLimit-Limit", "6")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Unix()+1, 10))
		writeErrors(w, http.StatusTooManyRequests, apiError{Message: "too many requests"})
		return
	case down:
		writeErrors(w, http.StatusServiceUnavailable, apiError{Message: "service unavailable"})
		return
	case noAccess:
		writeErrors(w, http.StatusForbidden, apiError{Message: "access forbidden"})
		return
	}
	limit, err := parseLimit(q)
	if err != nil {
		writeErrors(w, http.StatusBadRequest, fieldError("limit", err.Error()))
		return
	}
	cond, err := parseQuery(q.Get("query"))
	if err != nil {
		writeErrors(w, http.StatusBadRequest, fieldError("query", err.Error()))
		return
	}
	writeJSON(w, http.StatusOK, map[string][]ActivityMessage{"messages": s.search(cond, limit)})
}

// search returns up to limit indexed messages matching cond, most recent
// first, one entry per recipient.
func (s *Server) search(cond []condition, limit int) []ActivityMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	out := []ActivityMessage{}
	for i := len(s.messages) - 1; i >= 0 && len(out) < limit; i-- {
		if !s.visible(i, now) {
			continue
		}
		m := s.messages[i]
		for j, to := range m.To {
			a := ActivityMessage{MsgID: fullMessageID(m.MessageID, s.accepted[i], j), FromEmail: m.From, ToEmail: to,
				Subject: m.Subject, Status: "processed", LastEventTime: s.accepted[i].UTC().Format(time.RFC3339)}
			if matches(cond, m, a) && len(out) < limit {
				out = append(out, a)
			}
		}
	}
	return out
}

// fullMessageID derives SendGrid's per-recipient message ID from the
// request's X-Message-Id, like
// "v-iwGRqmdO9NFciFnhAUow.filter0001p1las1-16816-5A023E36-0.0".
func fullMessageID(xMessageID string, at time.Time, rcpt int) string {
	return fmt.Sprintf("%s.filter0001p1fake1-%d-%X-%d.0", xMessageID, at.Nanosecond()%100000, at.Unix(), rcpt)
}

func parseLimit(q map[string][]string) (int, error) {
	v := ""
	if l := q["limit"]; len(l) > 0 {
		v = l[0]
	}
	if v == "" {
		return 10, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		return 0, fmt.Errorf("limit must be a number greater than 0 and at most 1000")
	}
	return n, nil
}

func fieldError(field, msg string) apiError {
	return apiError{Field: &field, Message: msg}
}

// condition is one field="value" (or !=) of a query.
type condition struct {
	field string // msg_id, to_email, …, or "unique_args" with arg set.
	arg   string
	value string
	not   bool
}

var queryFields = map[string]bool{"msg_id": true, "from_email": true, "to_email": true, "subject": true, "status": true, "template_id": true}

func matches(conds []condition, m Message, a ActivityMessage) bool {
	for _, c := range conds {
		var got string
		switch c.field {
		case "unique_args":
			got = m.CustomArgs[c.arg]
		case "msg_id":
			got = a.MsgID
		case "from_email":
			got = a.FromEmail
		case "to_email":
			got = a.ToEmail
		case "subject":
			got = a.Subject
		case "status":
			got = a.Status
		case "template_id":
			got = m.TemplateID
		}
		if (got == c.value) == c.not {
			return false
		}
	}
	return true
}

// parseQuery parses the subset of SendGrid's query language described at
// the top of this file into a conjunction of conditions.
func parseQuery(q string) ([]condition, error) {
	p := &queryParser{s: q}
	var out []condition
	if strings.TrimSpace(q) == "" {
		return nil, nil
	}
	for {
		p.skipSpace()
		open := 0
		for p.eat("(") {
			open++
			p.skipSpace()
		}
		c, err := p.condition()
		if err != nil {
			return nil, err
		}
		out = append(out, c)
		for ; open > 0; open-- {
			p.skipSpace()
			if !p.eat(")") {
				return nil, p.errorf("expected )")
			}
		}
		p.skipSpace()
		if p.done() {
			return out, nil
		}
		if !p.eatWord("AND") {
			return nil, p.errorf("expected AND (the fake supports only AND)")
		}
	}
}

type queryParser struct {
	s   string
	pos int
}

func (p *queryParser) done() bool { return p.pos >= len(p.s) }

func (p *queryParser) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid query at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *queryParser) skipSpace() {
	for !p.done() && p.s[p.pos] == ' ' {
		p.pos++
	}
}

func (p *queryParser) eat(tok string) bool {
	if strings.HasPrefix(p.s[p.pos:], tok) {
		p.pos += len(tok)
		return true
	}
	return false
}

func (p *queryParser) eatWord(word string) bool {
	rest := p.s[p.pos:]
	if len(rest) > len(word) && strings.EqualFold(rest[:len(word)], word) && rest[len(word)] == ' ' {
		p.pos += len(word)
		return true
	}
	return false
}

func (p *queryParser) condition() (condition, error) {
	var c condition
	start := p.pos
	for !p.done() && (p.s[p.pos] == '_' || p.s[p.pos] >= 'a' && p.s[p.pos] <= 'z') {
		p.pos++
	}
	c.field = p.s[start:p.pos]
	switch {
	case c.field == "unique_args":
		if !p.eat("['") {
			return c, p.errorf("expected ['name'] after unique_args")
		}
		end := strings.Index(p.s[p.pos:], "']")
		if end <= 0 {
			return c, p.errorf("unterminated unique_args name")
		}
		c.arg = p.s[p.pos : p.pos+end]
		p.pos += end + 2
	case !queryFields[c.field]:
		return c, p.errorf("unknown or unsupported field %q", c.field)
	}
	p.skipSpace()
	switch {
	case p.eat("!="):
		c.not = true
	case p.eat("="):
	default:
		return c, p.errorf("expected = or != (the fake supports only these)")
	}
	p.skipSpace()
	v, err := p.quoted()
	c.value = v
	return c, err
}

func (p *queryParser) quoted() (string, error) {
	if !p.eat(`"`) {
		return "", p.errorf("expected a double-quoted value")
	}
	var b strings.Builder
	for !p.done() {
		ch := p.s[p.pos]
		p.pos++
		switch {
		case ch == '"':
			return b.String(), nil
		case ch == '\\' && !p.done():
			b.WriteByte(p.s[p.pos])
			p.pos++
		default:
			b.WriteByte(ch)
		}
	}
	return "", p.errorf("unterminated value")
}

// activityAdmin registers the admin routes of the look-up endpoint:
// POST /_fake/lookup-faults (a Fault, as POST /_fake/faults) and
// POST /_fake/lookup-outage ({"on": true|false}).
func (s *Server) activityAdmin(mux *http.ServeMux) {
	mux.HandleFunc("POST /_fake/lookup-faults", func(w http.ResponseWriter, r *http.Request) {
		var f Fault
		err := json.NewDecoder(r.Body).Decode(&f)
		if err == nil {
			err = f.Supported(activityFaultKinds...)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.InjectLookup(f)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /_fake/lookup-outage", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			On bool `json:"on"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.SetLookupOutage(body.On)
		w.WriteHeader(http.StatusNoContent)
	})
}
