package activities

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
)

// MarkPaid moves the order from pending to paid, once.
//
// Effect class: absolute write, guarded by a unique state transition. In one
// Postgres transaction (effects.DoTx) it claims the effect key
// ("…:mark_paid"), records the transition pending→paid with the effect key
// as its event ID, updates the order and completes the effect record, so
// that the three commit or roll back together. A second run returns the
// stored result and writes nothing. The order's charge effect must have
// succeeded.
//
// Errors (through ToTemporal): InvalidInput, OrderNotFound and InvalidState
// (no successful charge, or the order is neither pending nor already paid
// by this step) are non-retryable; Transient (a lost connection, a
// serialization failure) and InProgress are retryable.
func (a *Activities) MarkPaid(ctx context.Context, in orders.OrderInput) (orders.MarkPaidResult, error) {
	return DeclMarkPaid.Run(ctx, a, in, Effect[orders.MarkPaidResult]{
		// The order is not loaded up front: TransitionTx checks its status
		// and existence inside the transaction, and requireChargedTx reads
		// it there on the rare path that needs it. That saves a round trip.
		Lazy:        true,
		Fingerprint: func(*Step) []string { return []string{string(orders.StatusPending), string(orders.StatusPaid)} },
		Do: func(ctx context.Context, s *Step) (orders.MarkPaidResult, error) {
			if err := a.requireChargedTx(ctx, s.Tx, s); err != nil {
				return orders.MarkPaidResult{}, err
			}
			if _, err := a.orders.TransitionTx(ctx, s.Tx, in.TenantID, in.OrderID, orders.StatusPending, orders.StatusPaid, s.Key.String()); err != nil {
				return orders.MarkPaidResult{}, fmt.Errorf("mark paid %s: %w", s.Key, err)
			}
			return orders.MarkPaidResult{Status: string(orders.StatusPaid)}, nil
		},
	})
}

// requireChargedTx returns an InvalidState error unless the order's charge
// effect succeeded. The order already paid by this very step (its
// transition is recorded under r's effect key) passes too, so that a retry
// whose charge record was pruned still finds the work done; only then is
// the order read (in tx), and a missing order is an OrderNotFound error.
func (a *Activities) requireChargedTx(ctx context.Context, tx pgx.Tx, r *Step) error {
	_, err := a.requireChargeTx(ctx, tx, r, effects.StateSucceeded)
	if !errors.Is(err, ErrInvalidState) {
		return err
	}
	o, lerr := a.orders.GetTx(ctx, tx, r.In.TenantID, r.In.OrderID)
	if lerr != nil {
		return loadOrderError(r, lerr)
	}
	if o.Status.WasPaid() {
		return nil // TransitionTx finds this step's own transition and changes nothing.
	}
	return err
}

// requireChargeTx returns the order's charge effect record, read in tx so
// that the step never holds one pooled connection while it waits for
// another, or an InvalidState error naming r's step unless that record is in
// state want.
func (a *Activities) requireChargeTx(ctx context.Context, tx pgx.Tx, r *Step, want effects.State) (*effects.Record, error) {
	what := strings.ReplaceAll(r.step, "_", " ")
	chargeKey, err := r.In.EffectKey(orders.StepCharge)
	if err != nil {
		return nil, err
	}
	rec, err := a.claims.GetTx(ctx, tx, chargeKey)
	if errors.Is(err, effects.ErrNotFound) {
		return nil, &Error{Type: ErrTypeInvalidState, kind: ErrInvalidState,
			Message: fmt.Sprintf("%s %s: no charge recorded under %s", what, r.Key, chargeKey)}
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, r.Key, err)
	}
	if rec.State != want {
		return nil, &Error{Type: ErrTypeInvalidState, kind: ErrInvalidState,
			Message: fmt.Sprintf("%s %s: charge %s is %s, not %s", what, r.Key, chargeKey, rec.State, want)}
	}
	return rec, nil
}
