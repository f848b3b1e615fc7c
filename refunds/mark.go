package refunds

import (
	"context"
	"fmt"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
)

// MarkRefunded moves the order to refunded when its ledger sums to its
// amount, and to partially_refunded otherwise, once per refund.
//
// Effect class: absolute write, guarded by a unique state transition. In one
// Postgres transaction (effects.DoTx) it claims the effect key
// ("…:refund_mark"), takes the order's lock (as Reserve does, so that two
// refunds of one order mark it one after the other), sums the ledger,
// records the transition from the order's status (paid, partially_refunded
// or, after a later refund was marked first, refunded) with the effect key
// as its event ID, updates the order and completes the record. The refund
// must be in the ledger and its Stripe refund recorded. A second run returns
// the stored MarkResult; one whose record was pruned finds its own
// transition and changes nothing. The status only ever grows (paid →
// partially_refunded → refunded), because the ledger only grows.
//
// Errors (through activities.ToTemporal): InvalidInput, OrderNotFound and
// InvalidState (the refund is not in the ledger or not refunded at Stripe,
// or the order is not paid) are non-retryable; Transient and InProgress are
// retryable.
func (a *Activities) MarkRefunded(ctx context.Context, in RefundInput) (MarkResult, error) {
	return DeclMark.Run(ctx, a.run, in, effect[MarkResult]{Do: a.markTx})
}

// markTx moves the order to the status its ledger says, in c.Tx.
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
			err = c.Fail(activities.ErrTypeInvalidState, "refund %s has no Stripe refund recorded", c.In.RefundID)
		}
		return MarkResult{}, err
	}
	o, err := a.orders.GetTx(ctx, tx, tenant, id)
	if err != nil {
		return MarkResult{}, fmt.Errorf("mark refunded %s: load order: %w", c.Key, err)
	}
	if !o.Status.WasPaid() {
		return MarkResult{}, c.Fail(activities.ErrTypeInvalidState, "order is %s, not paid", o.Status)
	}
	refunded, err := a.ledger.RefundedTx(ctx, tx, tenant, id)
	if err != nil {
		return MarkResult{}, err
	}
	to := orders.StatusPartiallyRefunded
	if refunded >= o.AmountMinor {
		to = orders.StatusRefunded
	}
	if _, err := a.orders.TransitionTx(ctx, tx, tenant, id, o.Status, to, c.Key.String()); err != nil {
		return MarkResult{}, fmt.Errorf("mark refunded %s: %w", c.Key, err)
	}
	return MarkResult{Status: string(to)}, nil
}
