// Package outbox starts keyed workflows from a caller's own transaction.
//
// A handler that writes an order and then starts its workflow is two
// systems without a shared transaction. Commit first and die before the
// start, and the order sits unprocessed with nothing to alert on; start
// first and roll back, and the workflow runs for an order nobody can find.
// The outbox makes it one system: EnqueueTx writes the start request as a
// row in the caller's transaction, so the business write and the request
// commit or roll back together, and a Relay moves committed rows to
// Temporal afterwards.
//
// From a plain net/http handler:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		_, _, err := outbox.CreateOrderTx(ctx, tx, store, newOrder)
//		return err
//	})
//
// # The relay
//
// A Relay claims due rows with one UPDATE over a SELECT … FOR UPDATE SKIP
// LOCKED, so several relays split the work and never claim the same row.
// A claim is a lease: it moves the row's available_at past the lease, and a
// relay that dies holding rows gives them back when the lease runs out. For
// each row the relay starts the workflow under its business-derived ID
// (orders.WorkflowID), then marks the row sent. A relay that dies after the
// start and before the mark starts it again later, which is harmless: a
// second start of the same ID collapses into the first run, and that
// relay marks the row.
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
//   - A row carries what the start needs: EnqueueTx copies the order's
//     amount into it in the enqueueing transaction, and a RequestStarter
//     (fxapp.TemporalStarter) puts it in the run's static summary, so no
//     order is loaded per start.
//   - A row carries the trace context of the request that enqueued it (when
//     tracing is on), and the relay starts its run within that trace.
//   - EnqueueTx notifies Channel(schema) on commit, and a relay fed by
//     Listen claims at once rather than at its next poll; polling remains the
//     safety net. The channel name is a hash of the schema, so any schema
//     name fits Postgres's 63-byte limit.
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
	"github.com/keyedhq/keyed/internal/pgbatch"
	"github.com/keyedhq/keyed/internal/tracing"
	"github.com/keyedhq/keyed/orders"
)

// DefaultRetention is how long Prune keeps sent rows: a week, long enough
// to answer "when was this order's workflow started, and which run" during
// an incident review.
const DefaultRetention = 7 * 24 * time.Hour

// ErrInvalid is wrapped by errors for an outbox request that can never be
// started, such as an invalid checkout input.
var ErrInvalid = errors.New("invalid outbox request")

// EnqueueTx records, inside the caller's transaction, a request to start the
// checkout workflow for in. The request commits or rolls back with tx: if tx
// rolls back, no workflow is ever started. The row also records the order's
// amount and currency if the order is visible in tx (CreateOrderTx writes it
// first), so that the relay need not load the order to start its run, and
// the trace context of ctx when it carries a span (see internal/tracing),
// so that the relay's start joins the enqueueing request's trace.
// Enqueueing the same workflow ID again is a no-op and returns
// enqueued=false. A new request also notifies the schema's outbox channel
// (see Channel and Listen), which Postgres delivers on commit, so that
// listening relays start it at once. It returns an error wrapping ErrInvalid
// when in does not validate, and the database error otherwise.
func EnqueueTx(ctx context.Context, tx pgx.Tx, in orders.CheckoutInput) (enqueued bool, err error) {
	if tx == nil {
		return false, errors.New("enqueue checkout: tx is nil")
	}
	if err := in.Validate(); err != nil {
		return false, fmt.Errorf("enqueue checkout: %w: %w", ErrInvalid, err)
	}
	payload, err := json.Marshal(in)
	if err != nil {
		return false, fmt.Errorf("enqueue checkout %s: encode input: %w", in.WorkflowID(), err)
	}
	// The row copies the order's amount, when the order is there, so that
	// the relay can show it in the run's summary without loading the order.
	tag, err := tx.Exec(ctx, `
INSERT INTO keyed_outbox (tenant_id, workflow_type, workflow_id, payload, amount_minor, currency, trace_context)
SELECT $1, $2, $3, $4, o.amount_minor, o.currency, $6
FROM (VALUES (1)) AS one
LEFT JOIN orders o ON o.tenant_id = $1 AND o.id = $5
ON CONFLICT (workflow_id) DO NOTHING`, in.TenantID, orders.WorkflowName, in.WorkflowID(), payload, in.OrderID, tracing.Inject(ctx))
	if err != nil {
		return false, fmt.Errorf("enqueue checkout %s: %w", in.WorkflowID(), err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	// Delivered on commit, and never if tx rolls back: listening relays
	// wake at once instead of at their next poll.
	if _, err := tx.Exec(ctx, `SELECT pg_notify(`+channelSQL+`, '')`); err != nil {
		return false, fmt.Errorf("enqueue checkout %s: notify relays: %w", in.WorkflowID(), err)
	}
	return true, nil
}

// CreateOrderTx creates the order with store and records the start of its
// checkout workflow, both inside the caller's transaction: they commit or
// roll back together. Like orders.Store.Create, an identical existing order
// is returned with created=false, and the start request is recorded only if
// it is not there yet. It returns a *orders.ValidationError for bad input,
// an error wrapping orders.ErrConflict when the order exists with other
// details, and the database error otherwise; on any error the caller must
// roll tx back.
func CreateOrderTx(ctx context.Context, tx pgx.Tx, store *orders.Store, o orders.NewOrder) (order *orders.Order, created bool, err error) {
	if store == nil {
		return nil, false, errors.New("create order: store is nil")
	}
	order, created, err = store.CreateTx(ctx, tx, o)
	if err != nil {
		return nil, false, err
	}
	if _, err := EnqueueTx(ctx, tx, orders.NewCheckoutInput(order.TenantID, order.ID)); err != nil {
		return nil, false, fmt.Errorf("create order %s/%s: %w", order.TenantID, order.ID, err)
	}
	return order, created, nil
}

// ErrNotFound means the outbox holds no row for the workflow ID: it was
// never enqueued, or it was sent and pruned.
var ErrNotFound = errors.New("outbox row not found")

// Entry is an outbox row as stored.
type Entry struct {
	WorkflowID string
	TenantID   string
	CreatedAt  time.Time
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
SELECT workflow_id, tenant_id, created_at, attempts, coalesce(last_error, ''), sent_at, coalesce(run_id, '')
FROM keyed_outbox WHERE workflow_id = $1`, workflowID).
		Scan(&e.WorkflowID, &e.TenantID, &e.CreatedAt, &e.Attempts, &e.LastError, &e.SentAt, &e.RunID)
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
	total, err := pgbatch.Delete(ctx, db, batch, `
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
