package order

import (
	"context"
	"errors"
	"fmt"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// MarkPaid moves the order from pending to paid, once, after its charge
// succeeded.
//
// Effect class: absolute write, its own guard (step.Declaration.SelfGuarded):
// it claims no effect record. One statement checks that the charge's record
// succeeded, updates the order and records the transition under the effect
// key as its event ID; a repeat finds that transition and changes nothing.
//
// Errors: InvalidInput, OrderNotFound and InvalidState (no successful
// charge, or the order is neither pending nor paid by this step) are
// terminal; Transient retries.
func (a *Activities) MarkPaid(ctx context.Context, in orders.OrderInput) (orders.MarkPaidResult, error) {
	return DeclMarkPaid.Run(ctx, a.run, in, step.Effect[orders.OrderInput, orders.MarkPaidResult]{
		Do: func(ctx context.Context, c *call) (orders.MarkPaidResult, error) {
			if a.orders == nil {
				return orders.MarkPaidResult{}, c.Fail(step.ErrTypeTerminal, "the worker has no database")
			}
			chargeKey, err := in.EffectKey(orders.StepCharge)
			if err != nil {
				return orders.MarkPaidResult{}, err
			}
			charged := &orders.Guard{SQL: effects.SucceededSQL(6, orders.StepCharge), Arg: chargeKey.String()}
			_, err = a.orders.Transition(ctx, in.TenantID, in.OrderID, orders.StatusPending, orders.StatusPaid, c.Key.String(), charged)
			if errors.Is(err, orders.ErrUnguarded) {
				return orders.MarkPaidResult{}, a.unpaidCharge(ctx, c)
			}
			if err != nil {
				return orders.MarkPaidResult{}, fmt.Errorf("mark paid %s: %w", c.Key, err)
			}
			return orders.MarkPaidResult{Status: string(orders.StatusPaid)}, nil
		},
	})
}

// unpaidCharge says why MarkPaid's guard did not hold: the InvalidState
// error of the charge's record, or a transient error when it has succeeded
// since the statement's snapshot.
func (a *Activities) unpaidCharge(ctx context.Context, c *call) error {
	if _, err := a.requireCharge(ctx, c, effects.StateSucceeded); err != nil {
		return err
	}
	return effects.Transient(fmt.Errorf("%s: the charge succeeded while the order was being marked paid", c))
}

// requireCharge returns the order's charge record, read in c.Tx when the
// step runs in one, or an InvalidState error unless it is in state want.
func (a *Activities) requireCharge(ctx context.Context, c *call, want effects.State) (*effects.Record, error) {
	chargeKey, err := c.In.EffectKey(orders.StepCharge)
	if err != nil {
		return nil, err
	}
	var rec *effects.Record
	if c.Tx != nil {
		rec, err = a.claims.GetTx(ctx, c.Tx, chargeKey)
	} else {
		rec, err = a.claims.Get(ctx, chargeKey)
	}
	switch {
	case errors.Is(err, effects.ErrNotFound):
		return nil, c.Fail(step.ErrTypeInvalidState, "no charge recorded under %s", chargeKey)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", c, err)
	case rec.State != want:
		return nil, c.Fail(step.ErrTypeInvalidState, "charge %s is %s, not %s", chargeKey, rec.State, want)
	}
	return rec, nil
}
