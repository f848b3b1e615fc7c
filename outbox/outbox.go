// Package outbox starts workflows from a caller's own transaction.
//
// A handler that writes a business row and then starts its workflow is two
// systems without a shared transaction. Commit first and die before the
// start, and the row sits unprocessed with nothing to alert on; start first
// and roll back, and the workflow runs for a row nobody can find. The
// outbox makes it one system: EnqueueTx writes the start request (workflow
// type, workflow ID, JSON payload) as a row in the caller's transaction, so
// the business write and the request commit or roll back together, and a
// Relay hands committed rows to a Starter afterwards.
//
// The package knows nothing of any workflow: a Request is a workflow type,
// a business-derived workflow ID, the input as JSON, and optionally a task
// queue, a tenant and small metadata for the Starter. Package
// outbox/temporalstart is the Starter for Temporal. The order pipeline's
// own enqueue is orders.EnqueueTx, and orders.Store.CreateAndEnqueueTx writes
// an order and the start of its run together. From a plain net/http
// handler:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if err := createInvoice(ctx, tx, inv); err != nil {
//			return err
//		}
//		payload, err := json.Marshal(InvoiceInput{TenantID: inv.TenantID, InvoiceID: inv.ID})
//		if err != nil {
//			return err
//		}
//		_, err = outbox.EnqueueTx(ctx, tx, outbox.Request{
//			WorkflowType: "InvoiceWorkflow",
//			WorkflowID:   "invoice:" + inv.TenantID + ":" + inv.ID,
//			Payload:      payload,
//			TenantID:     inv.TenantID,
//		})
//		return err
//	})
//
// # The relay
//
// A Relay claims due rows with one UPDATE over a SELECT … FOR UPDATE SKIP
// LOCKED, so several relays split the work and never claim the same row.
// A claim is a lease: it moves the row's available_at past the lease, and a
// relay that dies holding rows gives them back when the lease runs out. For
// each row the relay has its Starter start the workflow under the row's
// workflow ID, then marks the row sent. A relay that dies after the start
// and before the mark starts it again later, which is harmless: a Starter
// must make a second start of the same ID collapse into the first run, and
// that relay marks the row.
//
// The relay keeps up under load:
//
//   - Starts run concurrently, up to RelayOpts.Concurrency per relay
//     (DefaultConcurrency, chosen with the relay benchmark). Run claims only
//     as many rows as it has free slots and claims again as soon as a start
//     finishes, so a slow start holds up one slot, not a batch.
//   - Each row's result is recorded as soon as its start returns, with a
//     budget of its own (RelayOpts.RecordTimeout) counted from then, never
//     from the claim: a batch of slow starts cannot make later marks time out.
//   - A row whose start succeeded but whose mark failed is remembered and
//     marked by the relay's next pass, before it claims more, instead of
//     waiting out its lease to be started again.
//   - A row carries what the start needs: Request.Meta holds what the
//     enqueuer knew (the order pipeline puts the order's amount there for
//     the run's static summary), so no business row is loaded per start.
//   - A row carries the trace context of the request that enqueued it (when
//     tracing is on), and the relay starts its run within that trace.
//   - EnqueueTx notifies Channel(schema) on commit, and a relay fed by
//     Listen claims at once rather than at its next poll; polling remains the
//     safety net. The channel name is a hash of the schema, so any schema
//     name fits Postgres's 63-byte limit.
//
// # Fairness
//
// Rows are claimed round-robin across tenants (Request.TenantID; rows
// without one count as one tenant), so that one tenant's backlog cannot
// starve another's rows. EnqueueTx gives each row a round: one after its
// tenant's last unsent row, and never earlier than the round the relays are
// at (the lowest round of the rows never claimed). A claim takes due rows in
// round order, oldest first within a round. So a tenant with 10,000 rows
// waiting holds one row in each round, and another tenant's first row joins
// the current round: it is claimed after at most one row of every other
// tenant, within one batch while fewer tenants than BatchSize have rows
// waiting. A tenant that keeps enqueueing gets one row per round, as every
// other tenant with rows waiting does (a few, when it enqueues from
// concurrent transactions, which may share a round). The claim stays one statement, one
// index scan that stops after the batch, whatever the backlog or the number
// of tenants.
//
// A failed start pushes its row back by an exponential backoff with full
// jitter, and the relay itself backs off the same way before its next claim
// (starts already in flight finish), so an unreachable Temporal sees a
// trickle of retries, not a stampede.
//
// # Metrics
//
// NewMetrics registers the outbox depth (unsent rows) and the age of the
// oldest unsent row as gauges, plus counters of starts and failures and a
// histogram of enqueue-to-start latency. Watch the age: a depth of 10,000
// that drains in seconds is healthy, a depth of 3 whose oldest row is an
// hour old is an outage.
//
// # Retention
//
// Sent rows are kept for DefaultRetention so that an operator can see when
// each start happened and under which run ID; Prune, which the relay runs
// hourly, deletes them after that. Unsent rows are never pruned.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/tracing"
)

// DefaultRetention is how long Prune keeps sent rows: a week, long enough
// to answer "when was this workflow started, and which run" during an
// incident review.
const DefaultRetention = 7 * 24 * time.Hour

// ErrInvalid is wrapped by errors for an outbox request that can never be
// started, such as one without a workflow type or with a payload that is
// not JSON.
var ErrInvalid = errors.New("invalid outbox request")

// Request is one workflow start: what EnqueueTx records and what a Relay
// hands to its Starter.
type Request struct {
	// WorkflowType is the registered name of the workflow to start.
	// Required.
	WorkflowType string
	// WorkflowID is the run's ID, derived from the business event (such as
	// "order:acme:9f3a:fulfil") so that repeated starts collapse into one
	// run. The outbox holds one row per ID. Required.
	WorkflowID string
	// TaskQueue is where the run's tasks go. Empty means the Starter's
	// default, which is usually the right choice: the enqueuer rarely knows
	// the workers' queue.
	TaskQueue string
	// Payload is the workflow's input as JSON. Required; it should hold
	// identifiers and a version, not a serialized business row.
	Payload json.RawMessage
	// TenantID, if set, is the tenant the start belongs to, shown to
	// operators (see Get).
	TenantID string
	// Meta is small data for the Starter rather than the workflow, such as
	// what a run's summary or search attributes need, so that the Starter
	// need not load it per start. Nil means none.
	Meta map[string]string
}

// validate returns an error wrapping ErrInvalid when req cannot be
// started.
func (req Request) validate() error {
	switch {
	case req.WorkflowType == "":
		return fmt.Errorf("%w: workflow type is empty", ErrInvalid)
	case req.WorkflowID == "":
		return fmt.Errorf("%w: workflow ID is empty", ErrInvalid)
	case len(req.Payload) == 0 || !json.Valid(req.Payload):
		return fmt.Errorf("%w: payload of %s is not JSON", ErrInvalid, req.WorkflowID)
	}
	return nil
}

// EnqueueTx records req inside the caller's transaction. The request commits
// or rolls back with tx: if tx rolls back, no workflow is ever started. The
// row also records the trace context of ctx when it carries a span (see
// internal/tracing), so that the relay's start joins the enqueueing
// request's trace. Enqueueing the same workflow ID again is a no-op and
// returns enqueued=false, whatever the rest of req. A new request also
// notifies the schema's outbox channel (see Channel and Listen), which
// Postgres delivers on commit, so that listening relays start it at once.
// It returns an error wrapping ErrInvalid when req has no workflow type, no
// workflow ID or a payload that is not JSON, and the database error
// otherwise; on an error the caller must roll tx back.
func EnqueueTx(ctx context.Context, tx pgx.Tx, req Request) (enqueued bool, err error) {
	if tx == nil {
		return false, errors.New("enqueue workflow start: tx is nil")
	}
	if err := req.validate(); err != nil {
		return false, fmt.Errorf("enqueue workflow start: %w", err)
	}
	var meta []byte
	if len(req.Meta) > 0 {
		if meta, err = json.Marshal(req.Meta); err != nil {
			return false, fmt.Errorf("enqueue %s: encode meta: %w", req.WorkflowID, err)
		}
	}
	tag, err := tx.Exec(ctx, `
INSERT INTO keyed_outbox (workflow_type, workflow_id, task_queue, payload, tenant_id, meta, trace_context, fair_round)
VALUES ($1, $2, nullif($3, ''), $4, nullif($5, ''), $6, $7, `+fairRoundSQL+`)
ON CONFLICT (workflow_id) DO NOTHING`,
		req.WorkflowType, req.WorkflowID, req.TaskQueue, []byte(req.Payload), req.TenantID, meta, tracing.Inject(ctx))
	if err != nil {
		return false, fmt.Errorf("enqueue %s: %w", req.WorkflowID, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	// Delivered on commit, and never if tx rolls back: listening relays
	// wake at once instead of at their next poll.
	if _, err := tx.Exec(ctx, `SELECT pg_notify(`+channelSQL+`, '')`); err != nil {
		return false, fmt.Errorf("enqueue %s: notify relays: %w", req.WorkflowID, err)
	}
	return true, nil
}

// fairRoundSQL is the round of a new row of tenant $5 (see "Fairness" in
// the package doc): one after the tenant's last unsent row, but no earlier
// than the lowest round of the rows never claimed, the round the relays are
// at. Both are one index probe (migration 0016). Concurrent enqueues of one
// tenant may share a round.
const fairRoundSQL = `greatest(
	(SELECT max(fair_round) + 1 FROM keyed_outbox WHERE sent_at IS NULL AND coalesce(tenant_id, '') = $5),
	(SELECT min(fair_round) FROM keyed_outbox WHERE sent_at IS NULL AND attempts = 0),
	0)`

// ErrNotFound means the outbox holds no row for the workflow ID: it was
// never enqueued, or it was sent and pruned.
var ErrNotFound = errors.New("outbox row not found")

// Entry is an outbox row as stored.
type Entry struct {
	WorkflowID   string
	WorkflowType string
	// TenantID is empty when the request named none.
	TenantID  string
	CreatedAt time.Time
	// Attempts counts the relay's claims of the row.
	Attempts int
	// LastError is the error of the last failed start, if any.
	LastError string
	// SentAt is when the workflow was started, nil while the row waits.
	SentAt *time.Time
	// RunID is the run the start created or collapsed into.
	RunID string
}

// Get returns the outbox row for workflowID. It returns an error wrapping
// ErrNotFound when there is none, and the database error otherwise.
func Get(ctx context.Context, db effects.DB, workflowID string) (*Entry, error) {
	var e Entry
	err := db.QueryRow(ctx, `
SELECT workflow_id, workflow_type, coalesce(tenant_id, ''), created_at, attempts, coalesce(last_error, ''), sent_at, coalesce(run_id, '')
FROM keyed_outbox WHERE workflow_id = $1`, workflowID).
		Scan(&e.WorkflowID, &e.WorkflowType, &e.TenantID, &e.CreatedAt, &e.Attempts, &e.LastError, &e.SentAt, &e.RunID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("outbox %s: %w", workflowID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get outbox %s: %w", workflowID, err)
	}
	return &e, nil
}

// Stats describes the unsent rows of the outbox.
type Stats struct {
	// Depth is the number of unsent rows, due or backing off.
	Depth int64
	// OldestAge is how long the oldest unsent row has waited; zero when
	// there is none.
	OldestAge time.Duration
}

// ReadStats returns the outbox's depth and the age of its oldest unsent row.
// It returns the database error if the query fails.
func ReadStats(ctx context.Context, db effects.DB) (Stats, error) {
	var s Stats
	var ageMicros int64
	err := db.QueryRow(ctx, `
SELECT count(*), coalesce((extract(epoch FROM now() - min(created_at)) * 1000000)::bigint, 0)
FROM keyed_outbox WHERE sent_at IS NULL`).Scan(&s.Depth, &ageMicros)
	if err != nil {
		return Stats{}, fmt.Errorf("read outbox stats: %w", err)
	}
	s.OldestAge = time.Duration(max(ageMicros, 0)) * time.Microsecond
	return s, nil
}

// PruneOpts configures Prune. A nil *PruneOpts means all defaults.
type PruneOpts struct {
	// Retention is how long sent rows are kept. Zero means
	// DefaultRetention. Values under one hour are refused.
	Retention time.Duration
	// BatchSize bounds each DELETE. Zero means 1000.
	BatchSize int
}

// Prune deletes rows sent longer ago than the retention, in batches, and
// returns how many it deleted. It never deletes an unsent row. It returns an
// error for a retention under one hour and the database error otherwise.
func Prune(ctx context.Context, db effects.DB, opts *PruneOpts) (int64, error) {
	if opts == nil {
		opts = &PruneOpts{}
	}
	retention, batch := opts.Retention, opts.BatchSize
	if retention == 0 {
		retention = DefaultRetention
	}
	if retention < time.Hour {
		return 0, fmt.Errorf("prune outbox: retention %s is under one hour", retention)
	}
	if batch <= 0 {
		batch = 1000
	}
	total, err := effects.DeleteInBatches(ctx, db, batch, `
DELETE FROM keyed_outbox WHERE id IN (
	SELECT id FROM keyed_outbox
	WHERE sent_at IS NOT NULL AND sent_at < now() - $1 * interval '1 microsecond'
	ORDER BY sent_at LIMIT $2
	FOR UPDATE SKIP LOCKED)`, retention.Microseconds())
	if err != nil {
		return total, fmt.Errorf("prune outbox: %w", err)
	}
	return total, nil
}
