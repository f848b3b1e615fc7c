package orders

import (
	"fmt"
	"strconv"
	"strings"
)

// NormalizeCurrency returns code in lower case, as Stripe writes it. It
// returns a *ValidationError for "currency" when code has a non-ASCII
// character (checked before case mapping: strings.ToLower maps the Kelvin
// sign to k). It does not check code against Currencies; NewOrder.Validate
// does.
func NormalizeCurrency(code string) (string, error) {
	for i := 0; i < len(code); i++ {
		if code[i] >= 0x80 {
			return "", &ValidationError{Field: "currency", Reason: fmt.Sprintf("%.16q is not an ISO 4217 code: it has non-ASCII characters", code)}
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
