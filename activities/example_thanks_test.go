package activities

import (
	"context"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
)

// DeclSendThanks declares SendThanks: an irreversible send, at most once, keyed "…:thanks".
var DeclSendThanks = Declare[notify.Result](Declaration{Name: "SendThanks", Class: effects.ClassIrreversibleSend, Step: "thanks", Policy: notify.AtMostOnce})

// SendThanks emails the customer a thank-you note for the order, once. Errors as SendReceipt's.
func (a *Activities) SendThanks(ctx context.Context, in orders.OrderInput) (notify.Result, error) {
	return DeclSendThanks.Run(ctx, a, in, Effect[notify.Result]{Do: func(ctx context.Context, s *Step) (notify.Result, error) {
		return a.sender.Send(ctx, s.Message("thanks", s.Order.CustomerEmail, "Thank you for order "+s.In.OrderID, "Thank you!"))
	}})
}
