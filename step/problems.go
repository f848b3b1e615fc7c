package step

import (
	"errors"
	"fmt"
	"strings"
)

// The helpers below check an outcome type's fields in its Validate: each
// returns what is wrong with one field, or "", and Problems joins them.

// Problems returns an error listing the non-empty problems, joined by
// "; ", or nil.
func Problems(problems ...string) error {
	var out []string
	for _, p := range problems {
		if p != "" {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return errors.New(strings.Join(out, "; "))
}

// maxProviderID bounds a provider's ID in an outcome.
const maxProviderID = 255

// ProviderIDProblem checks id as a provider ID: prefix followed by letters
// and digits; what names it, such as "a Stripe PaymentIntent ID".
func ProviderIDProblem(field, prefix, what, id string) string {
	rest, ok := strings.CutPrefix(id, prefix)
	switch {
	case id == "":
		return fmt.Sprintf("%s is required: %s, %s…", field, what, prefix)
	case !ok || rest == "" || len(id) > maxProviderID || strings.IndexFunc(rest, notIDChar) >= 0:
		return fmt.Sprintf("%s %q is not %s (%s followed by letters and digits)", field, id, what, prefix)
	}
	return ""
}

// MessageIDProblem checks id as SendGrid's X-Message-Id: printable ASCII
// without spaces, at most 255 bytes.
func MessageIDProblem(field, id string) string {
	switch {
	case id == "":
		return field + " is required: the X-Message-Id SendGrid shows for the message"
	case len(id) > maxProviderID || strings.IndexFunc(id, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
		return fmt.Sprintf("%s %q is not a message ID (printable ASCII without spaces, at most %d bytes)", field, id, maxProviderID)
	}
	return ""
}

// AmountProblem checks minor as an amount in minor units: positive.
func AmountProblem(field string, minor int64) string {
	if minor <= 0 {
		return fmt.Sprintf("%s %d is not an amount in minor units (a positive whole number)", field, minor)
	}
	return ""
}

// CurrencyProblem checks cur as a currency: three lower-case letters, as
// Stripe writes it.
func CurrencyProblem(field, cur string) string {
	if len(cur) != 3 || strings.IndexFunc(cur, func(r rune) bool { return r < 'a' || r > 'z' }) >= 0 {
		return fmt.Sprintf("%s %q is not a currency (three lower-case letters, such as \"eur\")", field, cur)
	}
	return ""
}

// OneOfProblem checks that v is one of want.
func OneOfProblem(field, v string, want ...string) string {
	for _, w := range want {
		if v == w {
			return ""
		}
	}
	quoted := make([]string, len(want))
	for i, w := range want {
		quoted[i] = fmt.Sprintf("%q", w)
	}
	return fmt.Sprintf("%s %q is not %s", field, v, strings.Join(quoted, " or "))
}

func notIDChar(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
}
