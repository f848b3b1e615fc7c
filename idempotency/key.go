package idempotency

import (
	"fmt"
	"strings"
)

// ParseKey returns the key an Idempotency-Key field value carries,
// or what is wrong with it. Surrounding spaces and tabs are trimmed. A value
// starting with a double quote is an RFC 8941 String (printable ASCII, \" and
// \\ unescaped, nothing after the closing quote, so no parameters); any other
// is a bare token of printable ASCII without spaces. abc and "abc" are one
// key, of 1 to MaxKeyLen bytes. problem follows "Idempotency-Key"
// and never quotes the value.
func ParseKey(v string) (key, problem string) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", "is empty"
	}
	if v[0] != '"' {
		if problem := keyProblem(v, false); problem != "" {
			return "", problem
		}
		return v, ""
	}
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			if i+1 == len(v) {
				return "", "ends in a backslash inside its quotes"
			}
			i++
			if next := v[i]; next != '"' && next != '\\' {
				return "", fmt.Sprintf("byte %d: a backslash may only escape \" or \\ inside quotes (RFC 8941 §3.3.3), not 0x%02x", i, next)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i+1 < len(v) {
				if v[i+1] == ';' {
					return "", "has parameters after its quoted key; send the key alone, such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\""
				}
				return "", fmt.Sprintf("has more after its closing quote at byte %d; send one quoted key alone", i)
			}
			if problem := keyProblem(b.String(), true); problem != "" {
				return "", problem
			}
			return b.String(), ""
		case c < 0x20 || c > 0x7e:
			return "", fmt.Sprintf("byte %d is 0x%02x; a quoted key holds printable ASCII only (RFC 8941 §3.3.3)", i, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", "opens a quote it does not close; send a bare key (abc) or a quoted one (\"abc\")"
}

// keyProblem checks an unquoted key: its length, and for a bare one its
// bytes (a quoted key's were checked while unquoting it).
func keyProblem(key string, quoted bool) string {
	switch {
	case key == "":
		return "is an empty string"
	case len(key) > MaxKeyLen:
		return fmt.Sprintf("is %d bytes; the limit is %d", len(key), MaxKeyLen)
	case quoted:
		return ""
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c >= 0x7f {
			return fmt.Sprintf("byte %d is 0x%02x; use printable ASCII without spaces, such as a UUID", i, c)
		}
	}
	return ""
}
