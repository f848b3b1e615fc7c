package idempotency

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/outbox"
)

// StartTx enqueues start (a pipeline run's start) and stores resp as the
// request's response in tx, the handler's own transaction with its business
// rows: all commit together or not at all. Once committed, a relay starts
// the run under start.WorkflowID (a repeat collapses into it) and a retry
// replays resp. It returns outbox.EnqueueTx's errors (outbox.ErrInvalid for
// a start that can never run) and CompleteTx's (ErrLeaseLost); on an error
// tx must roll back, and the middleware releases the key.
func (q *Request) StartTx(ctx context.Context, tx pgx.Tx, start outbox.Request, resp Response) error {
	if start.TenantID == "" {
		start.TenantID = q.tenant
	}
	if _, err := outbox.EnqueueTx(ctx, tx, start); err != nil {
		return fmt.Errorf("start %s: %w", start.WorkflowID, err)
	}
	return q.CompleteTx(ctx, tx, resp)
}
