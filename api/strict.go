package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
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
			return newError(http.StatusBadRequest, CodeDuplicateField, name, "%s appears more than once", echo(name))
		}
		seen[name] = true
		if want, ok := caseVariant(name, known); ok {
			return newError(http.StatusBadRequest, CodeUnknownField, name, "member names are case-sensitive: %s is not %q", echo(name), want)
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

// checkText refuses a body whose text encoding/json would decode into other
// text than was sent: bytes that are not UTF-8, and a \u escape of half a
// UTF-16 surrogate pair, which both become U+FFFD. It names the offset.
func checkText(body []byte) *Error {
	for i := 0; i < len(body); {
		r, size := utf8.DecodeRune(body[i:])
		if r == utf8.RuneError && size == 1 {
			return newError(http.StatusBadRequest, CodeInvalidJSON, "",
				"the body is not valid UTF-8: byte 0x%02x at offset %d; send UTF-8 text", body[i], i)
		}
		i += size
	}
	if at := loneSurrogate(body); at >= 0 {
		return newError(http.StatusBadRequest, CodeInvalidJSON, "",
			"the body escapes half of a UTF-16 surrogate pair (%s at offset %d); send the character itself or both halves", body[at:at+6], at)
	}
	return nil
}

// loneSurrogate returns the offset of the first \u escape in body of a
// surrogate that is not half of a pair, or -1. body is valid JSON, so a
// backslash stands only in a string, before the character it escapes.
func loneSurrogate(body []byte) int {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		r, ok := escapedRune(body, i)
		switch {
		case !ok:
			i++ // an escape of one character: skip it
		case r >= 0xdc00 && r <= 0xdfff:
			return i // a low half with no high half before it
		case r >= 0xd800 && r <= 0xdbff:
			if lo, ok := escapedRune(body, i+6); !ok || utf16.DecodeRune(r, lo) == utf8.RuneError {
				return i
			}
			i += 11
		default:
			i += 5
		}
	}
	return -1
}

// escapedRune reads the \uXXXX escape at body[i:], if there is one.
func escapedRune(body []byte, i int) (rune, bool) {
	if i+6 > len(body) || body[i] != '\\' || body[i+1] != 'u' {
		return 0, false
	}
	n, err := strconv.ParseUint(string(body[i+2:i+6]), 16, 32)
	return rune(n), err == nil
}
