package order

import (
	"context"
	"fmt"
	"time"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// SendReceipt emails the customer a receipt for the paid order, once.
//
// Effect class: irreversible send, through notify.Sender (template
// "receipt", the order as entity), under the Sender's policy for the
// template. A lost answer is settled from SendGrid's Email Activity before
// any resend.
//
// Errors: InvalidInput, OrderNotFound, InvalidState (the order is not
// paid), Ambiguous, ProviderRejected, KeyReused and Terminal are terminal;
// Transient, InProgress and LeaseLost retry.
func (a *Activities) SendReceipt(ctx context.Context, in orders.OrderInput) (orders.ReceiptResult, error) {
	var o *orders.Order
	return DeclSendReceipt.Run(ctx, a.run, in, step.Effect[orders.OrderInput, orders.ReceiptResult]{
		Check: func(ctx context.Context, c *call) (err error) {
			if a.sender == nil {
				return c.Fail(step.ErrTypeTerminal, "the worker has no SendGrid sender")
			}
			if o, err = a.loadOrder(ctx, c); err != nil {
				return err
			}
			if !o.Status.WasPaid() { // paid, or refunded since
				return c.Fail(step.ErrTypeInvalidState, "order is %s, not paid", o.Status)
			}
			return nil
		},
		NotBefore: func(*call) time.Time { return o.CreatedAt },
		Do:        func(ctx context.Context, c *call) (orders.ReceiptResult, error) { return a.sendReceipt(ctx, c, o) },
	})
}

// sendReceipt sends o's receipt through the Sender, which claims c.Key.
func (a *Activities) sendReceipt(ctx context.Context, c *call, o *orders.Order) (orders.ReceiptResult, error) {
	text := fmt.Sprintf("Thank you for your order %s.\n\nWe charged %s to your card.\n\nReference: %s\n",
		o.ID, orders.FormatAmount(o.AmountMinor, o.Currency), c.Key)
	m := c.Message(ReceiptTemplate, o.CustomerEmail, "Your receipt for order "+o.ID, text, o.ID)
	// A receipt for an order paid long ago may have lost its record: ask first.
	m.LookUpFirst = time.Since(o.UpdatedAt) > step.RecordHorizon
	res, err := a.sender.Send(ctx, m)
	if err != nil {
		return orders.ReceiptResult{}, err
	}
	return orders.ReceiptResult{MessageID: res.MessageID, Collapsed: res.Collapsed}, nil
}
