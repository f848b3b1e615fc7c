package refund

import (
	"context"
	"fmt"
	"time"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// SendRefundEmail emails the customer that the refund was made, once.
//
// Effect class: irreversible send through notify.Sender (template
// "refund", the order and refund as entity); the refund must be recorded
// at Stripe.
//
// Errors: InvalidInput, OrderNotFound, InvalidState, Ambiguous,
// ProviderRejected, KeyReused and Terminal are terminal; Transient,
// InProgress and LeaseLost retry.
func (a *Activities) SendRefundEmail(ctx context.Context, in refunds.RefundInput) (refunds.EmailResult, error) {
	return DeclEmail.Run(ctx, a.run, in, effect[refunds.EmailResult]{
		Check: func(_ context.Context, c *call) error {
			if a.sender == nil {
				return c.Fail(step.ErrTypeTerminal, "the worker has no SendGrid sender")
			}
			return nil
		},
		Do: a.sendEmail,
	})
}

// sendEmail checks that the refund was made and sends its email.
func (a *Activities) sendEmail(ctx context.Context, c *call) (refunds.EmailResult, error) {
	in := c.In
	o, err := a.orders.Get(ctx, in.TenantID, in.OrderID)
	if err != nil {
		return refunds.EmailResult{}, fmt.Errorf("%s: load order: %w", c, err)
	}
	e, err := a.entry(ctx, c)
	if err != nil {
		return refunds.EmailResult{}, err
	}
	if _, found, err := a.ledger.StripeOutcome(ctx, in.TenantID, in.OrderID, in.RefundID); err != nil || !found {
		if err == nil {
			err = c.Fail(step.ErrTypeInvalidState, "refund %s has no Stripe refund recorded", in.RefundID)
		}
		return refunds.EmailResult{}, err
	}
	text := fmt.Sprintf("We refunded %s of your order %s to your card.\n\nReference: %s\n",
		orders.FormatAmount(e.AmountMinor, o.Currency), o.ID, c.Key)
	msg := c.Message(EmailTemplate, o.CustomerEmail, "Your refund for order "+o.ID, text, o.ID+"/"+e.RefundID)
	// A refund reserved long ago may have lost its record to the prune: ask
	// SendGrid before sending.
	msg.LookUpFirst = time.Since(e.CreatedAt) > step.RecordHorizon
	// No claim of the email's key precedes the refund's reservation.
	msg.NotBefore = e.CreatedAt
	res, err := a.sender.Send(ctx, msg)
	if err != nil {
		return refunds.EmailResult{}, err
	}
	return refunds.EmailResult{MessageID: res.MessageID, Collapsed: res.Collapsed}, nil
}
