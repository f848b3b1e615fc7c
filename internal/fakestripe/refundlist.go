package fakestripe

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

type refundList struct {
	Object  string    `json:"object"`
	Data    []*refund `json:"data"`
	HasMore bool      `json:"has_more"`
	URL     string    `json:"url"`
}

// refundFilter is the query of GET /v1/refunds.
type refundFilter struct {
	paymentIntent, charge       string
	startingAfter, endingBefore string
	limit                       int
	createdMin, createdMax      int64 // inclusive bounds
}

// listQueryParams are the parameters of GET /v1/refunds; Stripe rejects any
// other.
var listQueryParams = []string{"charge", "created", "ending_before", "expand", "limit", "payment_intent", "starting_after"}

// parseRefundFilter parses q, refusing unknown parameters and invalid
// numbers.
func parseRefundFilter(q url.Values) (refundFilter, *apiError) {
	f := refundFilter{paymentIntent: q.Get("payment_intent"), charge: q.Get("charge"), limit: 10,
		startingAfter: q.Get("starting_after"), endingBefore: q.Get("ending_before"), createdMax: 1<<63 - 1}
	invalid := func(param, code, msg string) (refundFilter, *apiError) {
		return f, &apiError{Type: "invalid_request_error", Param: param, Code: code, Message: msg}
	}
	for k := range q {
		if name, _, _ := strings.Cut(k, "["); !slices.Contains(listQueryParams, name) {
			return invalid(k, "parameter_unknown", "Received unknown parameter: "+k)
		}
	}
	if v := q.Get("limit"); v != "" {
		var err error
		if f.limit, err = strconv.Atoi(v); err != nil || f.limit < 1 || f.limit > 100 {
			return invalid("limit", "", "This value must be between 1 and 100.")
		}
	}
	for _, op := range []string{"", "[gt]", "[gte]", "[lt]", "[lte]"} {
		v := q.Get("created" + op)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return invalid("created"+op, "parameter_invalid_integer", "Invalid integer: "+v)
		}
		f.bound(op, n)
	}
	return f, nil
}

// bound narrows f's created range by "created<op>=n".
func (f *refundFilter) bound(op string, n int64) {
	switch op {
	case "":
		f.createdMin, f.createdMax = max(f.createdMin, n), min(f.createdMax, n)
	case "[gt]":
		f.createdMin = max(f.createdMin, n+1)
	case "[gte]":
		f.createdMin = max(f.createdMin, n)
	case "[lt]":
		f.createdMax = min(f.createdMax, n-1)
	case "[lte]":
		f.createdMax = min(f.createdMax, n)
	}
}

func (f refundFilter) match(re *refund) bool {
	return (f.paymentIntent == "" || re.PaymentIntent == f.paymentIntent) &&
		(f.charge == "" || re.Charge == f.charge) &&
		re.Created >= f.createdMin && re.Created <= f.createdMax
}

// listRefunds serves GET /v1/refunds: newest first, filtered by
// payment_intent, charge and created, paged by limit and starting_after or
// ending_before.
func (s *Server) listRefunds(w http.ResponseWriter, r *http.Request, _ string) {
	f, apiErr := parseRefundFilter(r.URL.Query())
	if apiErr != nil {
		writeError(w, http.StatusBadRequest, apiErr)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.paymentIntent != "" && s.intents[f.paymentIntent] == nil {
		writeError(w, http.StatusBadRequest, &apiError{Type: "invalid_request_error", Code: "resource_missing",
			Param: "payment_intent", Message: fmt.Sprintf("No such payment_intent: '%s'", f.paymentIntent)})
		return
	}
	var all []*refund
	for _, re := range slices.Backward(s.refunds) { // Newest first.
		if f.match(re) {
			all = append(all, re)
		}
	}
	page, ok := s.page(all, f.startingAfter, f.endingBefore, f.limit)
	if !ok {
		param, id := "starting_after", f.startingAfter
		if id == "" {
			param, id = "ending_before", f.endingBefore
		}
		writeError(w, http.StatusBadRequest, &apiError{Type: "invalid_request_error", Code: "resource_missing",
			Param: param, Message: fmt.Sprintf("No such refund: '%s'", id)})
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// page returns the page of all (newest first) after the refund
// startingAfter or before endingBefore, or false if the cursor is unknown.
// s.mu must be held.
func (s *Server) page(all []*refund, startingAfter, endingBefore string, limit int) (refundList, bool) {
	res := refundList{Object: "list", Data: []*refund{}, URL: "/v1/refunds"}
	lo, hi := 0, len(all)
	switch {
	case startingAfter != "":
		if s.refundsByID[startingAfter] == nil {
			return res, false
		}
		lo = len(all)
		if i := slices.IndexFunc(all, func(re *refund) bool { return re.ID == startingAfter }); i >= 0 {
			lo = i + 1
		}
		hi = min(lo+limit, len(all))
		res.HasMore = hi < len(all)
	case endingBefore != "":
		if s.refundsByID[endingBefore] == nil {
			return res, false
		}
		if i := slices.IndexFunc(all, func(re *refund) bool { return re.ID == endingBefore }); i >= 0 {
			hi = i
		}
		lo = max(hi-limit, 0)
		res.HasMore = lo > 0
	default:
		hi = min(limit, len(all))
		res.HasMore = hi < len(all)
	}
	res.Data = append(res.Data, all[lo:hi]...)
	return res, true
}
