package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultRetention is how long Prune keeps finished records: longer than the
// longest retry window plus the wait for a manual replay.
const DefaultRetention = 30 * 24 * time.Hour

// Record is an effect record as stored. It holds outcomes, never payloads.
type Record struct {
	Key          string          `json:"key"`
	TenantID     string          `json:"tenant_id"`
	Kind         string          `json:"kind"`
	State        State           `json:"state"`
	Owner        string          `json:"owner"`
	Fingerprint  string          `json:"fingerprint,omitempty"`
	Generation   int64           `json:"generation"`
	Attempts     int             `json:"attempts"`
	LeaseUntil   *time.Time      `json:"lease_until,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
	ErrorCode    string          `json:"error_code,omitempty"`
	ErrorMessage string          `json:"error_message,omitempty"`
	CreatedAt    time.Time       `json:"created_at"`
	UpdatedAt    time.Time       `json:"updated_at"`
	FinishedAt   *time.Time      `json:"finished_at,omitempty"`
}

const recordColumns = `key, tenant_id, kind, state, owner, fingerprint, generation, attempts, lease_until,
	result, coalesce(error_code, ''), coalesce(error_message, ''), created_at, updated_at, finished_at,
	coalesce(lease_until > now(), false)`

// scanRecord scans recordColumns: the record, and whether its lease is live.
func scanRecord(row pgx.Row) (*Record, bool, error) {
	var r Record
	var live bool
	err := row.Scan(&r.Key, &r.TenantID, &r.Kind, &r.State, &r.Owner, &r.Fingerprint, &r.Generation, &r.Attempts,
		&r.LeaseUntil, &r.Result, &r.ErrorCode, &r.ErrorMessage, &r.CreatedAt, &r.UpdatedAt, &r.FinishedAt, &live)
	return &r, live, err
}

// get reads key's record. It looks first in the classes a record of the
// key's last part, the kind a claim gives it by default, may be in, which
// plans and locks only their leaves; then, for a record claimed under
// another kind, in every other class.
func (c *Client) get(ctx context.Context, db DB, key Key) (*Record, bool, error) {
	parts := key.Parts()
	if len(parts) == 0 {
		return nil, false, fmt.Errorf("%w: key is empty", ErrInvalidKey)
	}
	classes := kindClasses(parts[len(parts)-1])
	rec, live, err := scanRecord(db.QueryRow(ctx, `SELECT `+recordColumns+` FROM keyed_effects
		WHERE key = $1 AND class IN (`+classes+`)`, key.String()))
	if errors.Is(err, pgx.ErrNoRows) {
		rec, live, err = scanRecord(db.QueryRow(ctx, `SELECT `+recordColumns+` FROM keyed_effects
		WHERE key = $1 AND class NOT IN (`+classes+`)`, key.String()))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, ErrNotFound
	}
	return rec, live, err
}

// Get returns the record for key. It returns ErrNotFound if there is none,
// and an error wrapping ErrInvalidKey for the zero Key.
func (c *Client) Get(ctx context.Context, key Key) (*Record, error) {
	rec, _, err := c.get(ctx, c.db, key)
	if err != nil {
		return nil, fmt.Errorf("get effect %s: %w", key, err)
	}
	return rec, nil
}

// GetTx is Get inside the caller's transaction: use it for a read that
// belongs to the transaction, so that the transaction never waits for a
// second pooled connection.
func (c *Client) GetTx(ctx context.Context, tx pgx.Tx, key Key) (*Record, error) {
	rec, _, err := c.get(ctx, tx, key)
	if err != nil {
		return nil, fmt.Errorf("get effect %s: %w", key, err)
	}
	return rec, nil
}

// SucceededSQL returns a SQL condition that holds when the record of kind
// whose key is passed as parameter $n has succeeded: for a write that may
// commit only once another step succeeded, checked in the write's own
// statement. It names the classes a record of kind can be in (its own,
// default and legacy), so that on the partitioned table the statement
// plans and locks only their leaves, not every leaf of every class. A
// succeeded record stays succeeded until it is retired.
func SucceededSQL(n int, kind string) string {
	return fmt.Sprintf("EXISTS (SELECT FROM keyed_effects WHERE key = $%d AND class IN (%s) AND state = 'succeeded')", n, kindClasses(kind))
}

// kindClasses lists, as SQL literals, the classes a record of kind can be
// in: its own, default and legacy.
func kindClasses(kind string) string {
	classes := "'default', 'legacy'"
	if c, err := (Lifetime{Kind: kind}).class(); err == nil {
		classes = "'" + c + "', " + classes
	}
	return classes
}

// List returns, oldest first (then by key), every record of prefix's
// tenant whose key extends prefix (for acme:order:9f3a: its charge,
// mark_paid, receipt). It never returns another tenant's records.
func (c *Client) List(ctx context.Context, prefix Key) ([]*Record, error) {
	return list(ctx, c.db, prefix)
}

// ListTx is List inside the caller's transaction, which then never waits for
// a second pooled connection.
func (c *Client) ListTx(ctx context.Context, tx pgx.Tx, prefix Key) ([]*Record, error) {
	return list(ctx, tx, prefix)
}

// listSQL is List's statement: the keys under a prefix as a range of the
// key index ($2 is the prefix and Separator, $3 the prefix and the byte
// after it; keys are in the "C" collation), so that a generic plan can
// use the index. Each value is read through a subquery so that a plan made
// for the values estimates no better than the generic plan: a session then
// keeps the generic plan after five calls instead of planning every call,
// which over every leaf costs about four times the execution. (A starts_with
// condition is an index range only for a constant prefix.)
const listSQL = `SELECT ` + recordColumns + ` FROM keyed_effects
		WHERE tenant_id = (SELECT $1::text) AND key >= (SELECT $2::text) AND key < (SELECT $3::text) ORDER BY created_at, key`

func list(ctx context.Context, db DB, prefix Key) ([]*Record, error) {
	rows, err := db.Query(ctx, listSQL, prefix.Tenant(), prefix.String()+Separator, prefix.String()+string(Separator[0]+1))
	if err != nil {
		return nil, fmt.Errorf("list effects %s: %w", prefix, err)
	}
	defer rows.Close()
	var out []*Record
	for rows.Next() {
		rec, _, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("list effects %s: %w", prefix, err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list effects %s: %w", prefix, err)
	}
	return out, nil
}

// pruneSQL deletes up to $2 finished legacy records older than $1
// microseconds, oldest first (OldestFirstSQL). class = 'legacy' keeps a
// converted table's DELETE to the legacy partition, and a record a claim
// took over meanwhile stays.
var pruneSQL = OldestFirstSQL("keyed_effects", `class = 'legacy' AND created_at < now() - $1 * interval '1 microsecond'
	AND state <> 'claimed' AND finished_at < now() - $1 * interval '1 microsecond'`, "created_at", 2)

// PruneOpts configures Prune. A nil *PruneOpts means all defaults.
type PruneOpts struct {
	// Retention is how long finished records are kept. Zero means
	// DefaultRetention. Values under one hour are refused.
	Retention time.Duration
	// BatchSize bounds each DELETE, so that pruning a large backlog does not
	// hold locks for long. Zero means 1000.
	BatchSize int
}

// Prune deletes, in batches, finished records of an unpartitioned table or
// of the legacy partition of a converted one whose finish is older than the
// retention, and returns how many it deleted. Leaves are dropped whole by
// Retire instead. It never deletes a claim, live or expired: only a
// takeover or an operator ends one.
func (c *Client) Prune(ctx context.Context, opts *PruneOpts) (int64, error) {
	if opts == nil {
		opts = &PruneOpts{}
	}
	retention, batch := opts.Retention, opts.BatchSize
	if retention == 0 {
		retention = DefaultRetention
	}
	if retention < time.Hour {
		return 0, fmt.Errorf("prune: retention %s is under one hour; records must outlive the retry window", retention)
	}
	if batch <= 0 {
		batch = 1000
	}
	total, err := DeleteInBatches(ctx, c.db, batch, pruneSQL, retention.Microseconds())
	if err != nil {
		return total, fmt.Errorf("prune effects: %w", err)
	}
	return total, nil
}
