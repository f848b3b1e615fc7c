package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
)

// createMembers are the members of a POST /v1/orders body, spelled exactly.
var createMembers = []string{"order_id", "amount_minor", "currency", "customer_email", "payment_method"}

// checkMembers refuses what encoding/json lets through in a JSON object: a
// member sent twice (400 duplicate_field) or in another case than its name
// (400 unknown_field), naming the member. The rest is left to the decoder.
func checkMembers(body []byte, known []string) *Error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, _ := tok.(string)
		if seen[name] {
			return newError(http.StatusBadRequest, CodeDuplicateField, name, "%s appears more than once", name)
		}
		seen[name] = true
		if want, ok := caseVariant(name, known); ok {
			return newError(http.StatusBadRequest, CodeUnknownField, name, "member names are case-sensitive: %q is not %q", name, want)
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// caseVariant returns the known member that name matches only when case
// is ignored, with ok true; encoding/json folds more than ASCII case (ſ
// matches s, K matches k), as does strings.EqualFold.
func caseVariant(name string, known []string) (string, bool) {
	for _, k := range known {
		if name != k && strings.EqualFold(name, k) {
			return k, true
		}
	}
	return "", false
}

// readError answers a failed body read without quoting the error, which
// names socket addresses: 408 request_timeout when the body did not arrive
// within the server's read timeout, else 400 invalid_json.
func readError(err error) *Error {
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return newError(http.StatusRequestTimeout, CodeRequestTimeout, "", "the body did not arrive in time; send it at once, then retry")
	}
	return newError(http.StatusBadRequest, CodeInvalidJSON, "", "the body could not be read in full")
}
