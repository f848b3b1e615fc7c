package fakestripe

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// clause is one term of a Stripe search query, e.g. metadata['k']:'v'.
type clause struct {
	negate     bool
	field, key string // key is the metadata key
	op, value  string
}

var (
	clauseRE = regexp.MustCompile(`^\s*(-?)([a-z_]+)(?:\[(?:'([^']*)'|"([^"]*)")\])?\s*(:|>=|<=|>|<)\s*(?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)"|([^\s'"]+))\s*`)
	joinRE   = regexp.MustCompile(`^(AND|OR)\s+`)
)

// parseQuery parses the subset of Stripe's search query language that
// payment intents support: clauses on amount, created, currency, customer,
// status and metadata['key'], joined by AND or by OR (not both).
func parseQuery(q string) (clauses []clause, or bool, err error) {
	join := ""
	for rest := q; ; {
		m := clauseRE.FindStringSubmatch(rest)
		if m == nil {
			return nil, false, fmt.Errorf("could not parse the query near %q", rest)
		}
		c := clause{negate: m[1] == "-", field: m[2], key: m[3] + m[4], op: m[5], value: m[6] + m[7] + m[8]}
		c.value = strings.NewReplacer(`\'`, `'`, `\"`, `"`, `\\`, `\`).Replace(c.value)
		switch {
		case c.field == "metadata" && c.key == "", c.field != "metadata" && m[3]+m[4] != "":
			return nil, false, fmt.Errorf("invalid field %q", strings.TrimSpace(m[0]))
		case c.field == "amount" || c.field == "created":
			if _, err := strconv.ParseInt(c.value, 10, 64); err != nil {
				return nil, false, fmt.Errorf("%s must be compared with an integer", c.field)
			}
		case c.op != ":":
			return nil, false, fmt.Errorf("operator %s is not supported on %s", c.op, c.field)
		case !slices.Contains([]string{"currency", "customer", "metadata", "status"}, c.field):
			return nil, false, fmt.Errorf("field %s is an unsupported search field for resource payment_intents", c.field)
		}
		clauses = append(clauses, c)
		if rest = rest[len(m[0]):]; rest == "" {
			return clauses, join == "OR", nil
		}
		j := joinRE.FindStringSubmatch(rest)
		if j == nil || join != "" && j[1] != join {
			return nil, false, fmt.Errorf("expected AND or OR (not both) near %q", rest)
		}
		join, rest = j[1], rest[len(j[0]):]
	}
}

func (c clause) match(pi *paymentIntent) bool {
	var got string
	var ok bool
	switch c.field {
	case "amount":
		got, ok = strconv.FormatInt(pi.Amount, 10), true
	case "created":
		got, ok = strconv.FormatInt(pi.Created, 10), true
	case "currency":
		got, ok = pi.Currency, true
		c.value = strings.ToLower(c.value)
	case "status":
		got, ok = pi.Status, true
	case "customer":
		if pi.Customer != nil {
			got, ok = *pi.Customer, true
		}
	case "metadata":
		got, ok = pi.Metadata[c.key]
	}
	res := ok && got == c.value
	if c.op != ":" {
		g, _ := strconv.ParseInt(got, 10, 64)
		v, _ := strconv.ParseInt(c.value, 10, 64)
		res = map[string]bool{">": g > v, ">=": g >= v, "<": g < v, "<=": g <= v}[c.op]
	}
	return res != c.negate
}

type searchResult struct {
	Object   string  `json:"object"`
	Data     []any   `json:"data"`
	HasMore  bool    `json:"has_more"`
	NextPage *string `json:"next_page"`
	URL      string  `json:"url"`
}

func (s *Server) search(w http.ResponseWriter, r *http.Request, _ string) {
	q := r.URL.Query()
	invalid := func(param, msg string) {
		writeError(w, http.StatusBadRequest, &apiError{Type: "invalid_request_error", Param: param, Message: msg})
	}
	if !q.Has("query") {
		invalid("query", "Missing required param: query.")
		return
	}
	clauses, or, err := parseQuery(q.Get("query"))
	if err != nil {
		invalid("query", "Invalid query: "+err.Error())
		return
	}
	limit, offset := 10, 0
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 100 {
			invalid("limit", "This value must be between 1 and 100.")
			return
		}
	}
	if v := q.Get("page"); v != "" {
		if offset, err = strconv.Atoi(strings.TrimPrefix(v, "page_")); err != nil || offset < 0 {
			invalid("page", "Invalid page: "+v)
			return
		}
	}

	cutoff := s.opts.Now().Add(-s.opts.SearchLag)
	var hits []*paymentIntent
	s.mu.Lock()
	for _, pi := range slices.Backward(s.ordered) { // Newest first.
		if s.opts.SearchLag > 0 && pi.at.After(cutoff) {
			continue
		}
		matched := !or
		for _, c := range clauses {
			if c.match(pi) == or {
				matched = or
				break
			}
		}
		if matched {
			hits = append(hits, pi)
		}
	}
	s.mu.Unlock()

	res := searchResult{Object: "search_result", Data: []any{}, URL: "/v1/payment_intents/search"}
	var expand []string
	if slices.Contains(expansions(q), "data.latest_charge") {
		expand = []string{"latest_charge"}
	}
	if offset < len(hits) {
		for _, pi := range hits[offset:min(offset+limit, len(hits))] {
			res.Data = append(res.Data, s.render(pi, expand))
		}
	}
	if next := offset + limit; next < len(hits) {
		res.HasMore, res.NextPage = true, new("page_"+strconv.Itoa(next))
	}
	writeJSON(w, http.StatusOK, res)
}
