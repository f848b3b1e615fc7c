package activities

import (
	"context"
	"fmt"
	"time"

	"github.com/keyedhq/keyed/orders"
)

// SendReceipt emails the customer a receipt for the paid order, once.
//
// Effect class: irreversible send. It goes through notify.Sender with
// template "receipt", the order's email as recipient, the order ID as
// entity and the effect key "…:receipt", under the policy the Sender has for
// the template (at most once unless configured otherwise) and its collapse
// window. The stored outcome is the message ID and the collapsed flag.
//
// A lost answer is not a verdict: the retry looks the effect key up in
// SendGrid's Email Activity API first and records a message it finds as
// sent (see notify.Sender.Send), so a receipt goes out twice only when
// SendGrid accepted it and did not index it within the lag window.
//
// Errors (through ToTemporal): InvalidInput, OrderNotFound, InvalidState
// (the order is not paid), Ambiguous (SendGrid could not be asked within
// the look-up bound whether an at-most-once receipt went out; it is not sent
// again), ProviderRejected (SendGrid 4xx), KeyReused and Terminal are
// non-retryable; Transient (429, 5xx, SendGrid unreachable, an unconfirmed
// send, a look-up waiting for SendGrid's index or failing), InProgress and
// LeaseLost are retryable.
func (a *Activities) SendReceipt(ctx context.Context, in orders.OrderInput) (orders.ReceiptResult, error) {
	return DeclSendReceipt.Run(ctx, a, in, Effect[orders.ReceiptResult]{
		Check: func(s *Step) error {
			if !s.Order.Status.WasPaid() { // paid, or refunded since
				return &Error{Type: ErrTypeInvalidState, kind: ErrInvalidState,
					Message: fmt.Sprintf("receipt %s: order is %s, not paid", s.Key, s.Order.Status)}
			}
			return nil
		},
		Do: a.sendReceipt,
	})
}

// sendReceipt sends the receipt through the Sender, which claims s.Key.
func (a *Activities) sendReceipt(ctx context.Context, s *Step) (orders.ReceiptResult, error) {
	o := s.Order
	text := fmt.Sprintf("Thank you for your order %s.\n\nWe charged %s to your card.\n\nReference: %s\n",
		o.ID, FormatAmount(o.AmountMinor, o.Currency), s.Key)
	m := s.Message(ReceiptTemplate, o.CustomerEmail, "Your receipt for order "+o.ID, text)
	// A receipt for an order paid long ago may have lost its record to the
	// prune: ask SendGrid before sending.
	m.LookUpFirst = time.Since(o.UpdatedAt) > RecordHorizon
	res, err := a.sender.Send(ctx, m)
	if err != nil {
		return orders.ReceiptResult{}, err
	}
	return orders.ReceiptResult{MessageID: res.MessageID, Collapsed: res.Collapsed}, nil
}
