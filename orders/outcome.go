package orders

import "github.com/keyedhq/keyed/step"

// The Validate methods check an outcome an operator gives a step with a
// "done" decision (step.OutcomeOf calls them), naming every problem.

// Validate checks a charge's outcome: a Stripe PaymentIntent ID (pi_…),
// status succeeded, a positive amount and a currency.
func (r ChargeResult) Validate() error {
	return step.Problems(
		step.ProviderIDProblem("payment_intent_id", "pi_", "a Stripe PaymentIntent ID", r.PaymentIntentID),
		step.OneOfProblem("status", r.Status, "succeeded"),
		step.AmountProblem("amount_minor", r.AmountMinor),
		step.CurrencyProblem("currency", r.Currency))
}

// Validate checks a mark-paid outcome: status paid.
func (r MarkPaidResult) Validate() error {
	return step.Problems(step.OneOfProblem("status", r.Status, string(StatusPaid)))
}

// Validate checks a mark-failed outcome: status failed.
func (r MarkFailedResult) Validate() error {
	return step.Problems(step.OneOfProblem("status", r.Status, string(StatusFailed)))
}

// Validate checks a receipt's outcome: the message ID SendGrid shows for
// it (its X-Message-Id). A receipt the collapse window dropped is keyed's
// to record, not an operator's.
func (r ReceiptResult) Validate() error {
	var collapsed string
	if r.Collapsed {
		collapsed = "collapsed is recorded by keyed for a dropped repeat, never decided; give the message_id SendGrid shows"
	}
	return step.Problems(step.MessageIDProblem("message_id", r.MessageID), collapsed)
}
