package idempotency

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderPrefer is the RFC 7240 request header a client asks to wait with,
// "Prefer: wait=10"; HeaderPreferenceApplied tells it the server did.
const (
	HeaderPrefer            = "Prefer"
	HeaderPreferenceApplied = "Preference-Applied"
)

// PreferredWait returns the wait r prefers (RFC 7240 §4.3, "Prefer: wait=N",
// N seconds), capped at limit (N past 32 bits too), and whether it asked
// for one and limit is positive. Preference names are case-insensitive, a value may be quoted,
// other preferences and parameters are ignored, and the first wait counts.
func PreferredWait(r *http.Request, limit time.Duration) (time.Duration, bool) {
	if limit <= 0 {
		return 0, false
	}
	for _, field := range r.Header.Values(HeaderPrefer) {
		for _, pref := range strings.Split(field, ",") {
			pref, _, _ = strings.Cut(pref, ";")
			name, value, ok := strings.Cut(pref, "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			value = strings.Trim(strings.TrimSpace(value), `"`)
			n, err := strconv.ParseUint(value, 10, 32)
			var num *strconv.NumError
			if errors.As(err, &num) && num.Err == strconv.ErrRange {
				return limit, true // more seconds than anyone waits: the most there is
			}
			if err != nil {
				return 0, false
			}
			return min(time.Duration(n)*time.Second, limit), true
		}
	}
	return 0, false
}
