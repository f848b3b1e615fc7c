package orders

import (
	"fmt"
	"strings"
)

// NormalizeCurrency returns a currency code as an order holds it: lower
// case, as Stripe writes it, so "EUR" and "eur" are one currency. It is
// the rule the API and starter create share. A code with a non-ASCII
// character is refused before any case mapping, with a *ValidationError
// for "currency": strings.ToLower maps the Kelvin sign K (U+212A) to k, and
// would make "DK\u212a" the Danish krone. NormalizeCurrency does not check
// the code against Currencies; NewOrder.Validate does.
func NormalizeCurrency(code string) (string, error) {
	for i := 0; i < len(code); i++ {
		if code[i] >= 0x80 {
			return "", &ValidationError{Field: "currency", Reason: fmt.Sprintf("%q is not an ISO 4217 code: it has non-ASCII characters", code)}
		}
	}
	return strings.ToLower(code), nil
}
