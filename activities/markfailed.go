package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
)

// MarkFailed moves the order from pending to failed, once, after its charge
// failed for good (a decline, a payment left incomplete).
//
// Effect class: absolute write, guarded by a unique state transition. In one
// Postgres transaction (effects.DoTx) it claims the effect key
// ("…:mark_failed"), records the transition pending→failed with the effect
// key as its event ID, updates the order and completes the effect record,
// so that the three commit or roll back together. A second run returns the
// stored result and writes nothing. The order's charge effect must have
// failed terminally (state failed_terminal), and not as KeyReused or
// Ambiguous, which leave open whether money moved; the result carries the
// charge's stored error code.
//
// Errors (through ToTemporal): InvalidInput, OrderNotFound and InvalidState
// (no charge that failed terminally, a charge that may have happened, or the
// order is neither pending nor already failed by this step) are
// non-retryable; Transient (a lost connection, a serialization failure) and
// InProgress are retryable.
func (a *Activities) MarkFailed(ctx context.Context, in orders.OrderInput) (orders.MarkFailedResult, error) {
	return DeclMarkFailed.Run(ctx, a, in, Effect[orders.MarkFailedResult]{
		Fingerprint: func(*Step) []string { return []string{string(orders.StatusPending), string(orders.StatusFailed)} },
		Do:          a.markFailed,
	})
}

// markFailed fails the order in s.Tx once its charge failed for good.
func (a *Activities) markFailed(ctx context.Context, s *Step) (orders.MarkFailedResult, error) {
	charge, err := a.requireChargeTx(ctx, s.Tx, s, effects.StateFailedTerminal)
	if errors.Is(err, ErrInvalidState) && s.Order.Status == orders.StatusFailed {
		// Only this step fails an order: its charge record was pruned
		// since, and TransitionTx finds its own transition.
		charge, err = &effects.Record{}, nil
	}
	if err != nil {
		return orders.MarkFailedResult{}, err
	}
	if mayHaveCharged[charge.ErrorCode] {
		return orders.MarkFailedResult{}, &Error{Type: ErrTypeInvalidState, kind: ErrInvalidState, Message: fmt.Sprintf(
			"mark failed %s: charge failed as %s, so it may have happened; an operator must look", s.Key, charge.ErrorCode)}
	}
	if _, err := a.orders.TransitionTx(ctx, s.Tx, s.In.TenantID, s.In.OrderID, orders.StatusPending, orders.StatusFailed, s.Key.String()); err != nil {
		return orders.MarkFailedResult{}, fmt.Errorf("mark failed %s: %w", s.Key, err)
	}
	return orders.MarkFailedResult{Status: string(orders.StatusFailed), ChargeError: charge.ErrorCode}, nil
}

// mayHaveCharged lists the stored charge failure codes after which money may
// have moved: the key came back at Stripe with other inputs, or the outcome
// is unknown. MarkFailed refuses to fail such an order.
var mayHaveCharged = map[string]bool{"key_reused": true, "ambiguous": true}
