package orders

import (
	"errors"
	"fmt"
	"strings"
)

// The Validate methods of the steps' outcomes check an outcome an operator
// gives with a "done" decision (activities.DecodeOutcome calls them): the
// provider's IDs the step would have stored, and the state it would have
// reached. Each error names every problem, joined by "; ".

// Validate checks a charge's outcome: a Stripe PaymentIntent ID (pi_…),
// status succeeded, a positive amount and a currency.
func (r ChargeResult) Validate() error {
	return Problems(
		ProviderIDProblem("payment_intent_id", "pi_", "a Stripe PaymentIntent ID", r.PaymentIntentID),
		OneOfProblem("status", r.Status, "succeeded"),
		AmountProblem("amount_minor", r.AmountMinor),
		CurrencyProblem("currency", r.Currency))
}

// Validate checks a mark-paid outcome: status paid.
func (r MarkPaidResult) Validate() error {
	return Problems(OneOfProblem("status", r.Status, string(StatusPaid)))
}

// Validate checks a mark-failed outcome: status failed.
func (r MarkFailedResult) Validate() error {
	return Problems(OneOfProblem("status", r.Status, string(StatusFailed)))
}

// Validate checks a receipt's outcome: the message ID SendGrid shows for
// it (its X-Message-Id). A receipt the collapse window dropped is keyed's
// to record, not an operator's.
func (r ReceiptResult) Validate() error {
	var collapsed string
	if r.Collapsed {
		collapsed = "collapsed is recorded by keyed for a dropped repeat, never decided; give the message_id SendGrid shows"
	}
	return Problems(MessageIDProblem("message_id", r.MessageID), collapsed)
}

// Problems returns an error listing the non-empty problems, joined by
// "; ", or nil when there are none.
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

// ProviderIDProblem returns what is wrong with id as the field's provider
// ID, which starts with prefix and is what (such as "a Stripe PaymentIntent
// ID"): it must be prefix followed by letters and digits. It returns ""
// when id is one.
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

// MessageIDProblem returns what is wrong with id as the field's message ID
// (SendGrid's X-Message-Id): it must be printable ASCII without spaces, at
// most 255 bytes. It returns "" when id is one.
func MessageIDProblem(field, id string) string {
	switch {
	case id == "":
		return field + " is required: the X-Message-Id SendGrid shows for the message"
	case len(id) > maxProviderID || strings.IndexFunc(id, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
		return fmt.Sprintf("%s %q is not a message ID (printable ASCII without spaces, at most %d bytes)", field, id, maxProviderID)
	}
	return ""
}

// AmountProblem returns what is wrong with minor as the field's amount in
// minor units: it must be positive.
func AmountProblem(field string, minor int64) string {
	if minor <= 0 {
		return fmt.Sprintf("%s %d is not an amount in minor units (a positive whole number)", field, minor)
	}
	return ""
}

// CurrencyProblem returns what is wrong with cur as the field's currency:
// three lower-case letters, as Stripe writes it.
func CurrencyProblem(field, cur string) string {
	if len(cur) != 3 || strings.IndexFunc(cur, func(r rune) bool { return r < 'a' || r > 'z' }) >= 0 {
		return fmt.Sprintf("%s %q is not a currency (three lower-case letters, such as \"eur\")", field, cur)
	}
	return ""
}

// OneOfProblem returns what is wrong with v as the field's value: it must
// be one of want.
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
