package orders

import (
	"fmt"
	"net/mail"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxEmailLen is the longest customer email accepted, in bytes: the 254
// that fit in an SMTP path (RFC 5321 §4.5.3.1.3 with RFC 3696 erratum 1690).
const MaxEmailLen = 254

// maxLocalLen and maxLabelLen are RFC 5321's limits on the local part and
// on one domain label.
const (
	maxLocalLen = 64
	maxLabelLen = 63
)

// ValidateEmail checks a customer email address against keyed's rule (the
// API's and starter create's, see docs/design.md, "The email rule"). It
// returns nil or a *ValidationError for the field "customer_email".
func ValidateEmail(addr string) error {
	if reason := emailProblem(addr); reason != "" {
		return &ValidationError{Field: "customer_email", Reason: reason}
	}
	return nil
}

func emailProblem(addr string) string {
	switch {
	case addr == "":
		return "empty"
	case len(addr) > MaxEmailLen:
		return fmt.Sprintf("%d bytes; the limit is %d", len(addr), MaxEmailLen)
	case !utf8.ValidString(addr):
		return "not valid UTF-8"
	}
	for i, r := range addr {
		if r == ' ' || !unicode.IsPrint(r) || defaultIgnorable(r) || r == brailleBlank {
			return fmt.Sprintf("character U+%04X at byte %d is a space, control or invisible character", r, i)
		}
	}
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return "no @: want a plain address such as ann@example.com"
	}
	local, domain := addr[:at], addr[at+1:]
	if local == "" || len(local) > maxLocalLen {
		return fmt.Sprintf("the part before @ must be 1 to %d bytes", maxLocalLen)
	}
	if r, _ := utf8.DecodeRuneInString(local); unicode.Is(unicode.M, r) {
		return fmt.Sprintf("the part before @ starts with the combining mark U+%04X, which has no character to combine with", r)
	}
	if reason := domainProblem(domain); reason != "" {
		return reason
	}
	if a, err := mail.ParseAddress(addr); err != nil || a.Address != addr {
		return "not a plain email address such as ann@example.com"
	}
	return ""
}

// brailleBlank is U+2800 BRAILLE PATTERN BLANK: a symbol (So) that shows
// nothing, and no Default_Ignorable_Code_Point.
const brailleBlank = '\u2800'

// defaultIgnorable reports whether r has the Unicode property
// Default_Ignorable_Code_Point, derived from Go's tables as
// DerivedCoreProperties.txt defines it (docs/design.md, orders);
// TestDefaultIgnorableIsUnicodes checks it against that file.
func defaultIgnorable(r rune) bool {
	switch {
	case unicode.Is(unicode.White_Space, r),
		r >= 0xFFF9 && r <= 0xFFFB,
		r >= 0x13430 && r <= 0x13440,
		unicode.Is(unicode.Prepended_Concatenation_Mark, r):
		return false
	}
	return unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Cf, unicode.Variation_Selector)
}

func domainProblem(domain string) string {
	if strings.HasPrefix(domain, "[") {
		return "IP-literal domains are not accepted; use a domain name"
	}
	for i := 0; i < len(domain); i++ {
		if domain[i] >= utf8.RuneSelf {
			return "the domain has non-ASCII characters; write an internationalized domain in its punycode form (xn--…)"
		}
	}
	labels := strings.Split(domain, ".")
	if len(labels) < 2 {
		return fmt.Sprintf("domain %q needs at least one dot, such as example.com", domain)
	}
	for _, l := range labels {
		if reason := labelProblem(l); reason != "" {
			return fmt.Sprintf("domain %q: %s", domain, reason)
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "IP addresses are not accepted as domains; use a domain name"
	}
	return ""
}

func labelProblem(l string) string {
	switch {
	case l == "":
		return "empty label"
	case len(l) > maxLabelLen:
		return fmt.Sprintf("a label is over %d bytes", maxLabelLen)
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Sprintf("label %q starts or ends with a hyphen", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Sprintf("label %q has %q; use letters, digits and hyphens", l, c)
		}
	}
	return ""
}
