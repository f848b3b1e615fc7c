package orders

import (
	"fmt"
	"strconv"
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

// zeroDecimal lists Stripe's zero-decimal currencies: their minor unit is
// the whole unit.
var zeroDecimal = map[string]bool{
	"bif": true, "clp": true, "djf": true, "gnf": true, "jpy": true, "kmf": true, "krw": true, "mga": true,
	"pyg": true, "rwf": true, "ugx": true, "vnd": true, "vuv": true, "xaf": true, "xof": true, "xpf": true,
}

// FormatAmount renders an amount in minor units for people: 1250 "eur" is
// "12.50 EUR", 1250 "jpy" is "1250 JPY".
func FormatAmount(minor int64, currency string) string {
	cur := strings.ToUpper(currency)
	if zeroDecimal[strings.ToLower(currency)] {
		return strconv.FormatInt(minor, 10) + " " + cur
	}
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	return fmt.Sprintf("%s%d.%02d %s", sign, minor/100, minor%100, cur)
}
