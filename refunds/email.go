package refunds

import (
	"context"
	"fmt"
	"time"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// SendRefundEmail emails the customer that the refund was made, once.
//
// Effect class: irreversible send. It goes through notify.Sender with
// template "refund" (EmailTemplate), the order's email as recipient, the
// order and refund ("<order>/<refund_id>") as entity, so that two refunds of
// one order are two emails even inside the collapse window, and the effect
// key "…:refund_email", under the Sender's policy for the template (at most
// once unless configured otherwise). The refund must be recorded at Stripe.
// A lost answer is settled as the receipt's is: the retry looks the key up
// in SendGrid's Email Activity API first. The stored outcome is the message
// ID and the collapsed flag.
//
// Errors (through step.ToTemporal): InvalidInput, OrderNotFound,
// InvalidState (the refund is not in the ledger or not refunded at Stripe),
// Ambiguous, ProviderRejected, KeyReused and Terminal are non-retryable;
// Transient, InProgress and LeaseLost are retryable.
func (a *Activities) SendRefundEmail(ctx context.Context, in RefundInput) (EmailResult, error) {
	return DeclEmail.Run(ctx, a.run, in, effect[EmailResult]{Do: a.sendEmail})
}

// sendEmail checks that the refund was made and sends its email.
func (a *Activities) sendEmail(ctx context.Context, c *call) (EmailResult, error) {
	in := c.In
	o, err := a.orders.Get(ctx, in.TenantID, in.OrderID)
	if err != nil {
		return EmailResult{}, fmt.Errorf("%s: load order: %w", c, err)
	}
	e, err := a.entry(ctx, c)
	if err != nil {
		return EmailResult{}, err
	}
	if _, found, err := a.ledger.StripeOutcome(ctx, in.TenantID, in.OrderID, in.RefundID); err != nil || !found {
		if err == nil {
			err = c.Fail(step.ErrTypeInvalidState, "refund %s has no Stripe refund recorded", in.RefundID)
		}
		return EmailResult{}, err
	}
	text := fmt.Sprintf("We refunded %s of your order %s to your card.\n\nReference: %s\n",
		orders.FormatAmount(e.AmountMinor, o.Currency), o.ID, c.Key)
	msg := c.Message(EmailTemplate, o.CustomerEmail, "Your refund for order "+o.ID, text, o.ID+"/"+e.RefundID)
	// A refund reserved long ago may have lost its record to the prune: ask
	// SendGrid before sending.
	msg.LookUpFirst = time.Since(e.CreatedAt) > step.RecordHorizon
	res, err := a.sender.Send(ctx, msg)
	if err != nil {
		return EmailResult{}, err
	}
	return EmailResult{MessageID: res.MessageID, Collapsed: res.Collapsed}, nil
}
