package refunds

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

// MarkRefunded moves the order to the status its refunds confirmed by
// Stripe say, once per refund: refunded when they sum to its amount,
// partially_refunded otherwise.
//
// Effect class: absolute write, guarded by a unique state transition. In one
// Postgres transaction (effects.DoTx) it claims the effect key
// ("…:refund_mark"), takes the order's lock (as Reserve and ReleaseRefund
// do, so that refunds of one order mark it one after the other), sums the
// amounts of the order's refunds whose Stripe refund is recorded
// (Ledger.ConfirmedTx; a refund reserved but still in flight does not
// count, unlike in Reserve's check), records the transition from the
// order's status (paid, partially_refunded or refunded) with the effect
// key, its own refund's, as its event ID, updates the order and completes
// the record. The refund must be in the ledger and its Stripe refund
// recorded. Whichever refund's MarkRefunded runs last sets the final
// status: every confirmed refund marks after its Stripe refund is recorded,
// and the confirmed sum only grows (a refund Stripe made is never released),
// so the status only grows too (paid → partially_refunded → refunded); a
// status an earlier keyed set from reservations, counting a refund Stripe
// then refused, is corrected, downwards if need be. A second run returns the stored MarkResult; one whose record was pruned
// finds its own transition and changes nothing.
//
// Errors (through step.ToTemporal): InvalidInput, OrderNotFound and
// InvalidState (the refund is not in the ledger or not refunded at Stripe,
// or the order is not paid) are non-retryable; Transient and InProgress are
// retryable.
func (a *Activities) MarkRefunded(ctx context.Context, in RefundInput) (MarkResult, error) {
	return DeclMark.Run(ctx, a.run, in, effect[MarkResult]{Do: a.markTx})
}

// markTx moves the order to the status its confirmed refunds say, in c.Tx.
func (a *Activities) markTx(ctx context.Context, c *call) (MarkResult, error) {
	tx := c.Tx
	orderKey, err := c.In.OrderKey()
	if err != nil {
		return MarkResult{}, err
	}
	if err := effects.LockEntityTx(ctx, tx, orderKey); err != nil {
		return MarkResult{}, err
	}
	tenant, id := c.In.TenantID, c.In.OrderID
	if to, found, err := a.orders.EventTransitionTx(ctx, tx, tenant, id, c.Key.String()); err != nil || found {
		return MarkResult{Status: string(to)}, err
	}
	if _, found, err := a.ledger.stripeOutcome(ctx, tx, tenant, id, c.In.RefundID); err != nil || !found {
		if err == nil {
			err = c.Fail(step.ErrTypeInvalidState, "refund %s has no Stripe refund recorded", c.In.RefundID)
		}
		return MarkResult{}, err
	}
	o, err := a.orders.GetTx(ctx, tx, tenant, id)
	if err != nil {
		return MarkResult{}, fmt.Errorf("mark refunded %s: load order: %w", c.Key, err)
	}
	if !o.Status.WasPaid() {
		return MarkResult{}, c.Fail(step.ErrTypeInvalidState, "order is %s, not paid", o.Status)
	}
	to, err := a.confirmedStatus(ctx, tx, o)
	if err != nil {
		return MarkResult{}, err
	}
	if _, err := a.orders.TransitionTx(ctx, tx, tenant, id, o.Status, to, c.Key.String()); err != nil {
		return MarkResult{}, fmt.Errorf("mark refunded %s: %w", c.Key, err)
	}
	return MarkResult{Status: string(to)}, nil
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
