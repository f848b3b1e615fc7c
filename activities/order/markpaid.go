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
// Effect class: absolute write, guarded by a unique state transition: the
// claim, the transition (event ID: the effect key), the order's update and
// the record commit in one transaction.
//
// Errors: InvalidInput, OrderNotFound and InvalidState (no successful
// charge, or the order is neither pending nor paid by this step) are
// terminal; Transient and InProgress retry.
func (a *Activities) MarkPaid(ctx context.Context, in orders.OrderInput) (orders.MarkPaidResult, error) {
	return DeclMarkPaid.Run(ctx, a.run, in, step.Effect[orders.OrderInput, orders.MarkPaidResult]{
		// TransitionTx checks the order inside the transaction: no load up front.
		Fingerprint: func(*call) []string { return []string{string(orders.StatusPending), string(orders.StatusPaid)} },
		Do: func(ctx context.Context, c *call) (orders.MarkPaidResult, error) {
			if err := a.requireChargedTx(ctx, c); err != nil {
				return orders.MarkPaidResult{}, err
			}
			if _, err := a.orders.TransitionTx(ctx, c.Tx, in.TenantID, in.OrderID, orders.StatusPending, orders.StatusPaid, c.Key.String()); err != nil {
				return orders.MarkPaidResult{}, fmt.Errorf("mark paid %s: %w", c.Key, err)
			}
			return orders.MarkPaidResult{Status: string(orders.StatusPaid)}, nil
		},
	})
}

// requireChargedTx returns an InvalidState error unless the order's charge
// succeeded or this very step already paid the order (its charge record may
// have been pruned since).
func (a *Activities) requireChargedTx(ctx context.Context, c *call) error {
	_, err := a.requireChargeTx(ctx, c, effects.StateSucceeded)
	if !errors.Is(err, step.ErrInvalidState) {
		return err
	}
	o, lerr := a.orders.GetTx(ctx, c.Tx, c.In.TenantID, c.In.OrderID)
	if lerr != nil {
		return fmt.Errorf("%s: load order: %w", c, lerr)
	}
	if o.Status.WasPaid() {
		return nil // TransitionTx finds this step's own transition and changes nothing.
	}
	return err
}

// requireChargeTx returns the order's charge record, read in c.Tx, or an
// InvalidState error unless it is in state want.
func (a *Activities) requireChargeTx(ctx context.Context, c *call, want effects.State) (*effects.Record, error) {
	chargeKey, err := c.In.EffectKey(orders.StepCharge)
	if err != nil {
		return nil, err
	}
	rec, err := a.claims.GetTx(ctx, c.Tx, chargeKey)
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
