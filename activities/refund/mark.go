package refund

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// MarkRefunded moves the order, once per refund, to the status its refunds
// confirmed by Stripe say: refunded when they sum to its amount,
// partially_refunded otherwise.
// Effect class: absolute write, guarded by a unique state transition under
// the order's lock, in one transaction with the claim.
// Errors: InvalidInput, OrderNotFound and InvalidState (no ledger row or no
// Stripe refund recorded, or an unpaid order) are terminal; Transient and
// InProgress retry.
func (a *Activities) MarkRefunded(ctx context.Context, in refunds.RefundInput) (refunds.MarkResult, error) {
	return DeclMark.Run(ctx, a.run, in, effect[refunds.MarkResult]{Do: a.markTx})
}

// markTx moves the order to the status its confirmed refunds say, in c.Tx.
func (a *Activities) markTx(ctx context.Context, c *call) (refunds.MarkResult, error) {
	tx := c.Tx
	orderKey, err := c.In.OrderKey()
	if err != nil {
		return refunds.MarkResult{}, err
	}
	if err := effects.LockEntityTx(ctx, tx, orderKey); err != nil {
		return refunds.MarkResult{}, err
	}
	tenant, id := c.In.TenantID, c.In.OrderID
	if to, found, err := a.orders.EventTransitionTx(ctx, tx, tenant, id, c.Key.String()); err != nil || found {
		return refunds.MarkResult{Status: string(to)}, err
	}
	if _, found, err := a.ledger.StripeOutcomeTx(ctx, tx, tenant, id, c.In.RefundID); err != nil || !found {
		if err == nil {
			err = c.Fail(step.ErrTypeInvalidState, "refund %s has no Stripe refund recorded", c.In.RefundID)
		}
		return refunds.MarkResult{}, err
	}
	o, err := a.orders.GetTx(ctx, tx, tenant, id)
	if err != nil {
		return refunds.MarkResult{}, fmt.Errorf("mark refunded %s: load order: %w", c.Key, err)
	}
	if !o.Status.WasPaid() {
		return refunds.MarkResult{}, c.Fail(step.ErrTypeInvalidState, "order is %s, not paid", o.Status)
	}
	to, err := a.confirmedStatus(ctx, tx, o)
	if err != nil {
		return refunds.MarkResult{}, err
	}
	if _, err := a.orders.TransitionTx(ctx, tx, tenant, id, o.Status, to, c.Key.String()); err != nil {
		return refunds.MarkResult{}, fmt.Errorf("mark refunded %s: %w", c.Key, err)
	}
	return refunds.MarkResult{Status: string(to)}, nil
}

// confirmedStatus returns the status the paid order o should have by its
// refunds confirmed by Stripe (Ledger.ConfirmedTx), read in tx: paid with
// none, refunded when they sum to its amount, partially_refunded between.
func (a *Activities) confirmedStatus(ctx context.Context, tx pgx.Tx, o *orders.Order) (orders.Status, error) {
	confirmed, err := a.ledger.ConfirmedTx(ctx, tx, o.TenantID, o.ID)
	switch {
	case err != nil:
		return "", err
	case confirmed <= 0:
		return orders.StatusPaid, nil
	case confirmed < o.AmountMinor:
		return orders.StatusPartiallyRefunded, nil
	}
	return orders.StatusRefunded, nil
}
