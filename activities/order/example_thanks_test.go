package order

import (
	"context"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// DeclSendThanks declares SendThanks: an irreversible send, at most once, keyed "…:thanks".
var DeclSendThanks = declare[notify.Result](step.Declaration{Name: "SendThanks", Class: effects.ClassIrreversibleSend, Step: "thanks", Policy: notify.AtMostOnce})

// SendThanks emails the customer a thank-you note for the order, once. Errors as SendReceipt's.
func (a *Activities) SendThanks(ctx context.Context, in orders.OrderInput) (notify.Result, error) {
	return DeclSendThanks.Run(ctx, a.run, in, step.Effect[orders.OrderInput, notify.Result]{Do: func(ctx context.Context, c *call) (notify.Result, error) {
		o, err := a.loadOrder(ctx, c)
		if err != nil {
			return notify.Result{}, err
		}
		return a.sender.Send(ctx, c.Message("thanks", o.CustomerEmail, "Thank you for order "+o.ID, "Thank you!", o.ID))
	}})
}
