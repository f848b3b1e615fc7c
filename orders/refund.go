package orders

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/step"
)

// Order statuses after a refund (package refunds). A paid order becomes
// partially_refunded while its refunds sum to less than its amount, and
// refunded once they sum to all of it.
const (
	StatusPartiallyRefunded Status = "partially_refunded"
	StatusRefunded          Status = "refunded"
)

// WasPaid reports whether an order in status s was paid: paid, or refunded
// in part or in full since.
func (s Status) WasPaid() bool {
	return s == StatusPaid || s == StatusPartiallyRefunded || s == StatusRefunded
}

// Refundable reports whether an order in status s may be refunded (more):
// it was paid and is not refunded in full.
func (s Status) Refundable() bool { return s == StatusPaid || s == StatusPartiallyRefunded }

// EventTransitionTx returns, in tx, the status the order moved to for
// eventID, or found=false when no transition was recorded for it.
func (s *Store) EventTransitionTx(ctx context.Context, tx pgx.Tx, tenantID, id, eventID string) (to Status, found bool, err error) {
	return eventTransition(ctx, tx, tenantID, id, eventID)
}

func eventTransition(ctx context.Context, db effects.DB, tenantID, id, eventID string) (to Status, found bool, err error) {
	err = db.QueryRow(ctx, `
SELECT to_state FROM order_transitions
WHERE tenant_id = $1 AND order_id = $2 AND event_id = $3
ORDER BY created_at DESC LIMIT 1`, tenantID, id, eventID).Scan(&to)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read transition of order %s/%s for %s: %w", tenantID, id, eventID, err)
	}
	return to, true, nil
}

// VerifyTransition is the step.Verify of a step that moves an order to want
// with its effect key as the event ID: nil when the transition under key
// went to want, a contradiction when there is none or it went elsewhere,
// unverifiable when the database cannot be read.
func (s *Store) VerifyTransition(ctx context.Context, tenantID, orderID string, key effects.Key, want Status) error {
	to, found, err := eventTransition(ctx, s.db, tenantID, orderID, key.String())
	switch {
	case err != nil:
		return step.Unverifiable("read the order's transitions: %v", err)
	case !found:
		return step.Contradicted("order %s/%s has no transition recorded under %s: the step did not write it; decide retry", tenantID, orderID, key)
	case to != want:
		return step.Contradicted("order %s/%s moved to %s under %s, not %s", tenantID, orderID, to, key, want)
	}
	return nil
}
