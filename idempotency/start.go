package idempotency

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/outbox"
)

// StartTx enqueues start, a pipeline run's start, and stores resp as the
// request's response, both in tx: the handler's own transaction, in which it
// wrote its business rows before. The rows, the start and the response
// commit together or not at all; once committed, a relay starts the run
// (under start.WorkflowID, so a repeat collapses into the first run) and a
// retry of the request replays resp. The same for every pipeline:
// enqueueing a workflow ID already enqueued is a no-op, and it returns
// outbox.EnqueueTx's errors (wrapping outbox.ErrInvalid for a start that can
// never run) and CompleteTx's (ErrLeaseLost: roll back); on an error tx must
// roll back, and the middleware then releases the key.
func (q *Request) StartTx(ctx context.Context, tx pgx.Tx, start outbox.Request, resp Response) error {
	if start.TenantID == "" {
		start.TenantID = q.tenant
	}
	if _, err := outbox.EnqueueTx(ctx, tx, start); err != nil {
		return fmt.Errorf("start %s: %w", start.WorkflowID, err)
	}
	return q.CompleteTx(ctx, tx, resp)
}
