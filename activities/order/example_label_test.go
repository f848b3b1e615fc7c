package order

// This file is docs/adding-an-activity.md, compiled: BuyLabel, an external
// create at a shipping carrier (internal/carrier, faked by
// internal/fakecarrier). It is a test file so that the order pipeline does
// not buy labels; in production the carrier is a field of Activities that
// New fills with pipeline.Provider, and Definitions lists DeclBuyLabel.

import (
	"context"
	"errors"
	"time"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/carrier"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// LabelResult is BuyLabel's outcome: the carrier's label.
type LabelResult struct {
	LabelID  string `json:"label_id"`
	Tracking string `json:"tracking"`
}

// Validate refuses an outcome without the label's ID.
func (r LabelResult) Validate() error {
	if r.LabelID == "" {
		return errors.New("label_id is required")
	}
	return nil
}

// DeclBuyLabel declares BuyLabel, the order's shipping label.
var DeclBuyLabel = declare[LabelResult](step.Declaration{Name: "BuyLabel", Class: effects.ClassExternalCreate, Step: "label"})

// labelSteps is Activities with the carrier field production would add.
type labelSteps struct {
	*Activities
	labels *carrier.Client
}

// LabelDefinition returns BuyLabel bound to a and c, with its Verify.
func LabelDefinition(a *Activities, c *carrier.Client) step.Definition {
	l := &labelSteps{Activities: a, labels: c}
	return DeclBuyLabel.Define(l.BuyLabel, l.verifyLabel)
}

// BuyLabel buys the order's shipping label at the carrier, once.
//
// Effect class: external create. The effect key is the purchase's
// Idempotency-Key, so a retry after a lost answer gets the first label.
// Errors: OrderNotFound and a carrier refusal (ProviderRejected) are
// terminal; timeouts, 429s and 5xx retry.
func (a *labelSteps) BuyLabel(ctx context.Context, in orders.OrderInput) (LabelResult, error) {
	var o *orders.Order
	return DeclBuyLabel.Run(ctx, a.run, in, step.Effect[orders.OrderInput, LabelResult]{
		Check: func(ctx context.Context, c *call) (err error) {
			o, err = a.loadOrder(ctx, c)
			return err
		},
		// The key derives from the order: no claim of it precedes the order.
		NotBefore: func(*call) time.Time { return o.CreatedAt },
		Do: func(ctx context.Context, c *call) (LabelResult, error) {
			if a.labels == nil {
				return LabelResult{}, c.Fail(step.ErrTypeTerminal, "the worker has no carrier client")
			}
			l, err := a.labels.Buy(ctx, c.Key.String(), c.In.OrderID)
			if refused := (*carrier.RefusedError)(nil); errors.As(err, &refused) && !effects.IsTransient(err) {
				return LabelResult{}, c.Fail(step.ErrTypeProviderRejected, "%v", err)
			}
			return LabelResult{LabelID: l.ID, Tracking: l.Tracking}, err
		}})
}

// verifyLabel checks an operator's "done" label against the carrier.
func (a *labelSteps) verifyLabel(ctx context.Context, key effects.Key, r LabelResult) error {
	if a.labels == nil {
		return step.Unverifiable("no carrier client to ask (CARRIER_API_KEY is not set)")
	}
	l, err := a.labels.Get(ctx, r.LabelID)
	if err != nil {
		return step.Unverifiable("ask the carrier for label %s: %v", r.LabelID, err)
	}
	if _, id, err := orderOfKey(key); err != nil || l.Order != id {
		return step.Contradicted("label %s is for order %s, not the order of %s", l.ID, l.Order, key)
	}
	return nil
}
