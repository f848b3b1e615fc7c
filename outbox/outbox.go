// Package outbox starts workflows from a caller's own transaction: EnqueueTx
// writes the start request (workflow type, workflow ID, JSON payload) as a row
// in the caller's transaction, so the business write and the request commit or
// roll back together, and a Relay hands committed rows to a Starter
// afterwards (outbox/temporalstart for Temporal). Relays split the work with
// SKIP LOCKED leases, claim round-robin across tenants and back off on
// failure; Prune deletes sent rows after DefaultRetention.
//
// The relay's design, fairness and metrics are described in docs/design.md
// ("Notes moved from the code", outbox).
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

// EnqueueTx records req in tx, with ctx's trace context, and, unless an
// enqueue of this process did so within NotifyWindow, notifies the schema's
// outbox channel on commit; if tx rolls back, nothing starts.
// Enqueueing a workflow ID again is a no-op returning enqueued=false. It
// returns an error wrapping ErrInvalid for a missing workflow type or ID or a
// payload that is not JSON, and the database error otherwise; on an error the
// caller must roll tx back.
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
	// wake at once instead of at their next poll; only one enqueue per
	// NotifyWindow and schema of this process notifies.
	if !wakes.due(tx) {
		return true, nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify(`+channelSQL+`, '')`); err != nil {
		return false, fmt.Errorf("enqueue %s: notify relays: %w", req.WorkflowID, err)
	}
	return true, nil
}

// NotifyWindow bounds how often one process's enqueues into one schema
// notify relays: the first enqueue in a window notifies, the others in it
// do not. A relay woken by Listen looks again every NotifyWindow (every
// quarter of it while looks find rows) for 10×NotifyWindow after the
// wake-up, which finds their rows as they commit.
// A row committed later than that, or after a notifying transaction that
// rolled back, waits for the relay's next poll (RelayOpts.PollInterval).
// Why: docs/design.md, outbox.
const NotifyWindow = 20 * time.Millisecond

// wakes is the process's record of its last notification per database
// schema.
var wakes = newWakeLimiter(NotifyWindow)

// wakeLimiter says whether an enqueue should notify: whether the last
// notification into the same database and search path is a window old.
type wakeLimiter struct {
	window atomic.Int64 // nanoseconds; zero notifies every enqueue
	last   sync.Map     // target -> *atomic.Int64, Unix nanoseconds
}

func newWakeLimiter(window time.Duration) *wakeLimiter {
	l := &wakeLimiter{}
	l.window.Store(int64(window))
	return l
}

func (l *wakeLimiter) due(tx pgx.Tx) bool {
	window := l.window.Load()
	if window <= 0 {
		return true
	}
	target := notifyTarget(tx)
	v, ok := l.last.Load(target)
	if !ok {
		v, _ = l.last.LoadOrStore(target, new(atomic.Int64))
	}
	last := v.(*atomic.Int64)
	now := time.Now().UnixNano()
	for {
		prev := last.Load()
		if now-prev < window {
			return false
		}
		if last.CompareAndSwap(prev, now) {
			return true
		}
	}
}

// notifyTarget names the database and search path tx's connection was
// configured with: where its rows and its notification go. A transaction
// without a connection to read shares the empty target.
func notifyTarget(tx pgx.Tx) string {
	conn := tx.Conn()
	if conn == nil {
		return ""
	}
	cfg := conn.Config()
	return fmt.Sprintf("%s:%d/%s?%s", cfg.Host, cfg.Port, cfg.Database, cfg.RuntimeParams["search_path"])
}

// fairRoundSQL is the round of a new row of tenant $5: one after the tenant's
// last unsent row, but no earlier than the lowest round never claimed. Both
// are one index probe (migration 0016).
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
	e, err := scanEntry(db.QueryRow(ctx, `SELECT `+entryColumns+` FROM keyed_outbox WHERE workflow_id = $1`, workflowID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("outbox %s: %w", workflowID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get outbox %s: %w", workflowID, err)
	}
	return e, nil
}

// entryColumns are what scanEntry reads of a row.
const entryColumns = `workflow_id, workflow_type, coalesce(tenant_id, ''), created_at, attempts, coalesce(last_error, ''), sent_at, coalesce(run_id, '')`

func scanEntry(row pgx.Row) (*Entry, error) {
	var e Entry
	err := row.Scan(&e.WorkflowID, &e.WorkflowType, &e.TenantID, &e.CreatedAt, &e.Attempts, &e.LastError, &e.SentAt, &e.RunID)
	return &e, err
}

// GetMany returns the outbox rows of workflowIDs that exist, by workflow
// ID, in one statement. It returns the database error.
func GetMany(ctx context.Context, db effects.DB, workflowIDs []string) (map[string]*Entry, error) {
	rows, err := db.Query(ctx, `SELECT `+entryColumns+` FROM keyed_outbox WHERE workflow_id = ANY($1)`, workflowIDs)
	if err != nil {
		return nil, fmt.Errorf("get %d outbox rows: %w", len(workflowIDs), err)
	}
	out := make(map[string]*Entry, len(workflowIDs))
	_, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
		e, err := scanEntry(row)
		out[e.WorkflowID] = e
		return struct{}{}, err
	})
	if err != nil {
		return nil, fmt.Errorf("get %d outbox rows: %w", len(workflowIDs), err)
	}
	return out, nil
}

// MarkStarted marks workflowID's row sent as run runID, for a caller that
// started the run itself (an API's Update-with-Start), so that no relay
// starts it again; a row sent already is left as it is. It reports whether
// it marked the row, and returns the database error.
func MarkStarted(ctx context.Context, db effects.DB, workflowID, runID string) (bool, error) {
	tag, err := db.Exec(ctx, `
UPDATE keyed_outbox SET sent_at = now(), run_id = $2, claimed_by = NULL, last_error = NULL
WHERE workflow_id = $1 AND sent_at IS NULL`, workflowID, runID)
	if err != nil {
		return false, fmt.Errorf("mark %s started: %w", workflowID, err)
	}
	return tag.RowsAffected() == 1, nil
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

// pruneSQL deletes up to $2 rows sent more than $1 microseconds ago,
// oldest first (effects.OldestFirstSQL). A sent row is never written again,
// so it needs no lock before its DELETE; a row another prune deleted first
// is passed over.
var pruneSQL = effects.OldestFirstSQL("keyed_outbox",
	`sent_at IS NOT NULL AND sent_at < now() - $1 * interval '1 microsecond'`, "sent_at", 2)

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
	total, err := effects.DeleteInBatches(ctx, db, batch, pruneSQL, retention.Microseconds())
	if err != nil {
		return total, fmt.Errorf("prune outbox: %w", err)
	}
	return total, nil
}
