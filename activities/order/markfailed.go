package order

import (
	"context"
	"errors"
	"fmt"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// MarkFailed moves the order from pending to failed, once, after its charge
// failed for good; the result carries the charge's stored error code.
// Effect class: absolute write, guarded by a unique state transition, in one
// transaction as MarkPaid's.
// Errors: InvalidInput, OrderNotFound and InvalidState (no charge that failed
// terminally, one that may have happened, or an order neither pending nor
// failed by this step) are terminal; Transient and InProgress retry.
func (a *Activities) MarkFailed(ctx context.Context, in orders.OrderInput) (orders.MarkFailedResult, error) {
	var o *orders.Order
	return DeclMarkFailed.Run(ctx, a.run, in, step.Effect[orders.OrderInput, orders.MarkFailedResult]{
		Check:       func(ctx context.Context, c *call) (err error) { o, err = a.loadOrder(ctx, c); return err },
		Fingerprint: func(*call) []string { return []string{string(orders.StatusPending), string(orders.StatusFailed)} },
		Do:          func(ctx context.Context, c *call) (orders.MarkFailedResult, error) { return a.markFailed(ctx, c, o) },
	})
}

// markFailed fails o in c.Tx once its charge failed for good.
func (a *Activities) markFailed(ctx context.Context, c *call, o *orders.Order) (orders.MarkFailedResult, error) {
	charge, err := a.requireCharge(ctx, c, effects.StateFailedTerminal)
	if errors.Is(err, step.ErrInvalidState) && o.Status == orders.StatusFailed {
		// Only this step fails an order: its charge record was pruned since.
		charge, err = &effects.Record{}, nil
	}
	if err != nil {
		return orders.MarkFailedResult{}, err
	}
	if mayHaveCharged(charge.ErrorCode) {
		return orders.MarkFailedResult{}, c.Fail(step.ErrTypeInvalidState,
			"charge failed as %s, so it may have happened; an operator must look", charge.ErrorCode)
	}
	if _, err := a.orders.TransitionTx(ctx, c.Tx, c.In.TenantID, c.In.OrderID, orders.StatusPending, orders.StatusFailed, c.Key.String()); err != nil {
		return orders.MarkFailedResult{}, fmt.Errorf("mark failed %s: %w", c.Key, err)
	}
	return orders.MarkFailedResult{Status: string(orders.StatusFailed), ChargeError: charge.ErrorCode}, nil
}

// mayHaveCharged reports whether a charge that failed with code may have
// moved money: its key came back with other inputs, or its outcome is
// unknown.
func mayHaveCharged(code string) bool {
	return code == step.CodeKeyReused || code == step.CodeAmbiguous
}
