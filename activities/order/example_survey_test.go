package order

// This file is docs/adding-an-activity.md's example, compiled: a keyed
// activity written exactly as that page says. It is a test file only so
// that the order pipeline does not send surveys; DemoDefinitions registers
// it in the tests as Definitions registers a real one.

import (
	"context"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// DeclSendSurvey declares SendSurvey: an irreversible send, at most once, keyed "…:survey".
var DeclSendSurvey = declare[notify.Result](step.Declaration{Name: "SendSurvey", Class: effects.ClassIrreversibleSend, Step: "survey", Policy: notify.AtMostOnce})

// SendSurvey emails the customer a survey about the order, once. Errors as SendReceipt's.
func (a *Activities) SendSurvey(ctx context.Context, in orders.OrderInput) (notify.Result, error) {
	return DeclSendSurvey.Run(ctx, a.run, in, step.Effect[orders.OrderInput, notify.Result]{Do: func(ctx context.Context, c *call) (notify.Result, error) {
		o, err := a.loadOrder(ctx, c)
		if err != nil {
			return notify.Result{}, err
		}
		return a.sender.Send(ctx, c.Message("survey", o.CustomerEmail, "How was order "+o.ID+"?", "Reply to tell us.", o.ID))
	}})
}
