package orders

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Order statuses after a refund (package refunds). A paid order becomes
// partially_refunded while its refunds sum to less than its amount, and
// refunded once they sum to all of it.
const (
	StatusPartiallyRefunded Status = "partially_refunded"
	StatusRefunded          Status = "refunded"
)

// WasPaid reports whether an order in status s was paid: paid, or refunded
// in part or in full since. Steps of the order pipeline that need a paid
// order (the receipt) accept all three, since a refund may run before them.
func (s Status) WasPaid() bool {
	return s == StatusPaid || s == StatusPartiallyRefunded || s == StatusRefunded
}

// Refundable reports whether an order in status s may be refunded (more):
// it was paid and is not refunded in full.
func (s Status) Refundable() bool { return s == StatusPaid || s == StatusPartiallyRefunded }

// EventTransitionTx returns the status the order moved to for eventID,
// inside the caller's transaction, and found=false when no transition was
// recorded for that event. A step that transitions an order from whatever
// status it is in uses it to find its own earlier transition, since the
// from-state of a repeat may differ. It returns the database error, wrapped.
func (s *Store) EventTransitionTx(ctx context.Context, tx pgx.Tx, tenantID, id, eventID string) (to Status, found bool, err error) {
	err = tx.QueryRow(ctx, `
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
