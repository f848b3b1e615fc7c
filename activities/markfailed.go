package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

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
func (a *Activities) MarkFailed(ctx context.Context, in orders.CheckoutInput) (orders.MarkFailedResult, error) {
	res, err := a.markFailed(ctx, in)
	return res, ToTemporal(err)
}

func (a *Activities) markFailed(ctx context.Context, in orders.CheckoutInput) (orders.MarkFailedResult, error) {
	r, err := a.begin(ctx, in, orders.StepMarkFailed)
	if err != nil {
		return orders.MarkFailedResult{}, err
	}
	p := effects.ClaimParams{Key: r.key, Kind: r.step, Owner: r.owner,
		Fingerprint: fingerprint(string(orders.StatusPending), string(orders.StatusFailed))}
	var out orders.MarkFailedResult
	err = pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
		res, err := effects.DoTx(ctx, a.fx, tx, p, func(ctx context.Context, tx pgx.Tx, _ *effects.Claim) (orders.MarkFailedResult, error) {
			charge, err := a.requireChargeTx(ctx, tx, r, effects.StateFailedTerminal)
			if errors.Is(err, ErrInvalidState) && r.order.Status == orders.StatusFailed {
				// Only this step fails an order: its charge record was
				// pruned since, and TransitionTx finds its own transition.
				charge, err = &effects.Record{}, nil
			}
			if err != nil {
				return orders.MarkFailedResult{}, err
			}
			if mayHaveCharged[charge.ErrorCode] {
				return orders.MarkFailedResult{}, &Error{Type: ErrTypeInvalidState, kind: ErrInvalidState, Message: fmt.Sprintf(
					"mark failed %s: charge failed as %s, so it may have happened; an operator must look", r.key, charge.ErrorCode)}
			}
			if _, err := a.orders.TransitionTx(ctx, tx, in.TenantID, in.OrderID, orders.StatusPending, orders.StatusFailed, r.key.String()); err != nil {
				return orders.MarkFailedResult{}, fmt.Errorf("mark failed %s: %w", r.key, err)
			}
			return orders.MarkFailedResult{Status: string(orders.StatusFailed), ChargeError: charge.ErrorCode}, nil
		})
		out = res
		return err
	})
	if err != nil {
		r.log.WarnContext(ctx, "could not mark the order failed", "error", err)
		return orders.MarkFailedResult{}, err
	}
	r.log.InfoContext(ctx, "order failed", "charge_error", out.ChargeError)
	return out, nil
}

// mayHaveCharged lists the stored charge failure codes after which money may
// have moved: the key came back at Stripe with other inputs, or the outcome
// is unknown. MarkFailed refuses to fail such an order.
var mayHaveCharged = map[string]bool{"key_reused": true, "ambiguous": true}
