package refunds

import (
	"fmt"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// The Validate methods of the refund steps' outcomes check an outcome an
// operator gives with a "done" decision (step.OutcomeOf calls
// them), as orders' do for the order steps. Each error names every problem.

// Validate checks a reserve's outcome: the reserved amount and currency,
// within what the order's refunds hold of its charge.
func (r ReserveResult) Validate() error {
	held := ""
	if r.RefundedMinor < r.AmountMinor || r.ChargedMinor < r.RefundedMinor {
		held = fmt.Sprintf("refunded_minor %d must be at least amount_minor %d and at most charged_minor %d",
			r.RefundedMinor, r.AmountMinor, r.ChargedMinor)
	}
	return step.Problems(
		step.AmountProblem("amount_minor", r.AmountMinor),
		step.CurrencyProblem("currency", r.Currency),
		held)
}

// Validate checks a Stripe refund's outcome: a Stripe refund ID (re_…), the
// order's PaymentIntent (pi_…), a status Stripe made it with (succeeded or
// pending), a positive amount and a currency.
func (r StripeResult) Validate() error {
	return step.Problems(
		step.ProviderIDProblem("stripe_refund_id", "re_", "a Stripe refund ID", r.RefundID),
		step.ProviderIDProblem("payment_intent_id", "pi_", "a Stripe PaymentIntent ID", r.PaymentIntentID),
		step.OneOfProblem("status", r.Status, "succeeded", "pending"),
		step.AmountProblem("amount_minor", r.AmountMinor),
		step.CurrencyProblem("currency", r.Currency))
}

// Validate checks a mark-refunded outcome: the order's status after it.
func (r MarkResult) Validate() error {
	return step.Problems(step.OneOfProblem("status", r.Status,
		string(orders.StatusPaid), string(orders.StatusPartiallyRefunded), string(orders.StatusRefunded)))
}

// Validate checks a refund email's outcome: the message ID SendGrid shows.
func (r EmailResult) Validate() error {
	return orders.ReceiptResult(r).Validate()
}

// Validate checks a release's outcome: the amount given back and Stripe's
// refusal code.
func (r ReleaseResult) Validate() error {
	code := ""
	if r.Code == "" {
		code = "code is required: Stripe's refusal code, such as \"charge_disputed\""
	}
	return step.Problems(step.AmountProblem("amount_minor", r.AmountMinor), code)
}
