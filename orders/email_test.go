package orders_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/orders"
)

// Every address the issue found stored and sent is refused by
// ValidateEmail and by NewOrder.Validate, naming customer_email.
func TestValidateEmailRefusesWhatTheRuleForbids(t *testing.T) {
	t.Parallel()
	local63 := strings.Repeat("l", 63)
	label63 := strings.Repeat("d", 63)
	bad := map[string]string{
		"empty":                        "",
		"right-to-left override":       "ann\u202e@example.com",
		"zero-width space":             "ann\u200b@example.com",
		"byte order mark":              "\ufeffann@example.com",
		"C1 control":                   "ann\u0085@example.com",
		"C0 control":                   "ann\x01@example.com",
		"NUL":                          "ann\x00@example.com",
		"no-break space":               "ann\u00a0@example.com",
		"line separator":               "ann\u2028@example.com",
		"private use":                  "ann\ue000@example.com",
		"invalid UTF-8":                "ann\xff@example.com",
		"no dot in domain":             "a@b",
		"IP literal":                   "a@[127.0.0.1]",
		"IPv6 literal":                 "a@[IPv6:::1]",
		"dotted IP":                    "a@127.0.0.1",
		"leading hyphen":               "a@-b.com",
		"trailing hyphen":              "a@b-.com",
		"empty label":                  "a@b..com",
		"trailing dot":                 "a@example.com.",
		"label over 63":                "a@" + label63 + "d.com",
		"underscore in domain":         "a@ex_ample.com",
		"unicode domain":               "a@bücher.example",
		"60 KB":                        strings.Repeat("a", 60<<10) + "@example.com",
		"255 bytes":                    local63 + "@" + label63 + "." + label63 + "." + strings.Repeat("d", 255-63-1-63-1-63-1-4) + ".com",
		"local part over 64":           local63 + "ll@example.com",
		"display name":                 "Ann <ann@example.com>",
		"angle brackets":               "<ann@example.com>",
		"space":                        "ann lee@example.com",
		"no local part":                "@example.com",
		"no @":                         "ann.example.com",
		"two @":                        "ann@b@example.com",
		"comment":                      "ann@example.com (Ann)",
		"leading dot in local":         ".ann@example.com",
		"quoted local part with space": `"ann lee"@example.com`,
		// Invisible characters unicode.IsPrint lets through.
		"variation selector 16":        "ann\ufe0f@example.com",
		"variation selector 256":       "ann\U000e01ef@example.com",
		"combining grapheme joiner":    "ann\u034f@example.com",
		"Mongolian variation selector": "ann\u180b@example.com",
		"Hangul filler":                "ann\u3164@example.com",
		"Hangul filler alone":          "\u3164@example.com",
		"halfwidth Hangul filler":      "ann\uffa0@example.com",
		"Hangul choseong filler":       "ann\u115f@example.com",
		"braille blank":                "ann\u2800@example.com",
		"braille blank alone":          "\u2800@example.com",
		"soft hyphen":                  "an\u00adn@example.com",
		"tag character":                "ann\U000e0041@example.com",
		"lone combining acute":         "\u0301@example.com",
		"only combining marks":         "\u0301\u0308\u20dd@example.com",
		"leading combining mark":       "\u0301ann@example.com",
	}
	for name, addr := range bad {
		err := orders.ValidateEmail(addr)
		var verr *orders.ValidationError
		require.ErrorAs(t, err, &verr, "%s: %q accepted", name, addr)
		require.Equal(t, "customer_email", verr.Field, name)
		require.ErrorIs(t, err, orders.ErrInvalid, name)
		require.NotContains(t, verr.Reason, strings.Repeat("a", 100), "%s: the reason quotes the address", name)

		o := valid()
		o.CustomerEmail = addr
		require.ErrorAs(t, o.Validate(), &verr, "%s: NewOrder.Validate accepted %q", name, addr)
		require.Equal(t, "customer_email", verr.Field, name)
	}
	require.Contains(t, orders.ValidateEmail("a@bücher.example").Error(), "punycode")
}

func TestValidateEmailAcceptsOrdinaryAddresses(t *testing.T) {
	t.Parallel()
	label63 := strings.Repeat("d", 63)
	for _, addr := range []string{
		"ada@example.com",
		"Ada.Lovelace+receipts@mail.example.co.uk",
		"a_b-c!#$%&'*/=?^`{|}~@example.com",
		"ann@xn--bcher-kva.example",
		"ann@123.example",
		"ann@a-b.example",
		"josé@example.com",         // net/mail takes UTF-8 in the local part
		"jose\u0301@example.com",   // é decomposed: the mark sits on e
		"\u2801nn@example.com",     // a braille letter is not the blank
		"\u1100\u1161@example.com", // a Hangul syllable in jamo, no filler
		strings.Repeat("l", 64) + "@" + label63 + "." + label63 + "." + strings.Repeat("d", 254-64-1-63-1-63-1-4) + ".com", // exactly 254 bytes
	} {
		require.LessOrEqual(t, len(addr), orders.MaxEmailLen)
		require.NoError(t, orders.ValidateEmail(addr), addr)
	}
}
