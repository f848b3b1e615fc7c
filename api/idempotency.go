package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/pgbatch"
)

// Retention is how long a stored response stays replayable: 24 hours, as
// at Stripe. Prune never deletes a record younger than this, so a client may
// retry with the same Idempotency-Key for at least a day and get the first
// response back. After that the key may be used afresh.
const Retention = 24 * time.Hour

// DefaultRequestLease is how long a request holds its Idempotency-Key before
// another request may take it over. A holder that dies (its transaction
// rolled back, so it did nothing) blocks retries with 409 for at most this
// long.
const DefaultRequestLease = 30 * time.Second

// MaxIdempotencyKeyLen is the longest Idempotency-Key accepted, in bytes.
const MaxIdempotencyKeyLen = 255

// errKeyReused, errInProgress and errLeaseLost are the idempotency store's
// refusals; the handler turns them into 422, 409 and 409.
var (
	errKeyReused  = errors.New("idempotency key reused with a different request")
	errInProgress = errors.New("idempotency key held by a running request")
	errLeaseLost  = errors.New("idempotency key taken over by another request")
)

// stored is a finished request's response.
type stored struct {
	status int
	body   []byte
}

// idemStore keeps one record per (tenant, Idempotency-Key) in
// keyed_api_requests. A request claims its key with one INSERT … ON CONFLICT
// DO NOTHING; the winner runs, and stores its response in its own
// transaction with finishTx, so the business writes and the stored response
// commit or roll back together.
type idemStore struct {
	db    DB
	lease time.Duration
}

type claimOutcome int

const (
	claimNew claimOutcome = iota + 1
	claimTakeover
	claimReplay
)

// claim claims key for owner, or returns the stored response of a finished
// request with the same hash (claimReplay). It returns errKeyReused when the
// key was first used with another route or hash, and errInProgress when
// another request holds it under a live lease.
func (s *idemStore) claim(ctx context.Context, tenant, key, route, hash, owner string) (claimOutcome, *stored, error) {
	for range 5 {
		inserted, err := s.insertClaim(ctx, tenant, key, route, hash, owner)
		if err != nil {
			return 0, nil, fmt.Errorf("claim idempotency key: %w", err)
		}
		if inserted {
			return claimNew, nil, nil
		}

		var (
			gotRoute, gotHash, state, holder string
			live                             bool
			status                           *int
			body                             []byte
		)
		err = s.db.QueryRow(ctx, `
SELECT route, request_hash, state, owner, coalesce(locked_until > now(), false), status, response
FROM keyed_api_requests WHERE tenant_id = $1 AND idempotency_key = $2`, tenant, key).
			Scan(&gotRoute, &gotHash, &state, &holder, &live, &status, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // pruned between the insert and the read
		}
		if err != nil {
			return 0, nil, fmt.Errorf("read idempotency key: %w", err)
		}
		switch {
		case gotRoute != route || gotHash != hash:
			return 0, nil, errKeyReused
		case state == "done":
			return claimReplay, &stored{status: *status, body: body}, nil
		case live:
			return 0, nil, errInProgress
		}
		// The holder's lease ran out: it died, and its transaction rolled
		// back with it. One conditional UPDATE takes the key over.
		tag, err := s.db.Exec(ctx, `
UPDATE keyed_api_requests SET owner = $4, locked_until = now() + $5 * interval '1 microsecond'
WHERE tenant_id = $1 AND idempotency_key = $2 AND state = 'running' AND owner = $3 AND locked_until <= now()`,
			tenant, key, holder, owner, s.lease.Microseconds())
		if err != nil {
			return 0, nil, fmt.Errorf("take over idempotency key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return claimTakeover, nil, nil
		}
	}
	return 0, nil, errInProgress
}

// insertClaim inserts a running claim unless the key has a record, and
// reports whether it did. It commits without waiting for the WAL flush
// (synchronous_commit off, for this one statement's transaction): a claim
// only keeps live requests apart, so losing one in a database crash loses
// nothing the crash did not, and the request's own transaction commits
// synchronously, which flushes the WAL through the claim too. That saves
// one fsync per new request.
func (s *idemStore) insertClaim(ctx context.Context, tenant, key, route, hash, owner string) (bool, error) {
	tag, err := s.db.Exec(ctx, `
INSERT INTO keyed_api_requests (tenant_id, idempotency_key, route, request_hash, state, owner, locked_until)
SELECT $1, $2, $3, $4, 'running', $5, now() + $6 * interval '1 microsecond'
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING`, tenant, key, route, hash, owner, s.lease.Microseconds())
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// finishTx stores the response in tx, the transaction that made the
// request's writes. It returns errLeaseLost if another request took the
// key over, in which case tx must roll back.
func (s *idemStore) finishTx(ctx context.Context, tx pgx.Tx, tenant, key, owner string, resp stored) error {
	tag, err := tx.Exec(ctx, `
UPDATE keyed_api_requests
SET state = 'done', status = $4, response = $5, locked_until = NULL, finished_at = now()
WHERE tenant_id = $1 AND idempotency_key = $2 AND owner = $3 AND state = 'running'`,
		tenant, key, owner, resp.status, resp.body)
	if err != nil {
		return fmt.Errorf("store response: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errLeaseLost
	}
	return nil
}

// release deletes owner's claim, after a failure that wrote nothing, so that
// a retry runs at once instead of waiting out the lease.
func (s *idemStore) release(ctx context.Context, tenant, key, owner string) error {
	_, err := s.db.Exec(ctx, `
DELETE FROM keyed_api_requests
WHERE tenant_id = $1 AND idempotency_key = $2 AND owner = $3 AND state = 'running'`, tenant, key, owner)
	if err != nil {
		return fmt.Errorf("release idempotency key: %w", err)
	}
	return nil
}

// PruneOpts configures Prune. A nil *PruneOpts means all defaults.
type PruneOpts struct {
	// Retention is how long finished requests stay replayable. Zero means
	// Retention; shorter values are refused.
	Retention time.Duration
	// BatchSize bounds each DELETE. Zero means 1000.
	BatchSize int
}

// Prune deletes idempotency records older than the retention: finished
// requests by their finish time, and claims abandoned by a dead holder by
// their lease. It returns how many it deleted, and an error for a retention
// under Retention or from the database.
func Prune(ctx context.Context, db effects.DB, opts *PruneOpts) (int64, error) {
	if opts == nil {
		opts = &PruneOpts{}
	}
	retention, batch := opts.Retention, opts.BatchSize
	if retention == 0 {
		retention = Retention
	}
	if retention < Retention {
		return 0, fmt.Errorf("prune API requests: retention %s is under the documented %s", retention, Retention)
	}
	if batch <= 0 {
		batch = 1000
	}
	total, err := pgbatch.Delete(ctx, db, batch, `
DELETE FROM keyed_api_requests WHERE (tenant_id, idempotency_key) IN (
	SELECT tenant_id, idempotency_key FROM keyed_api_requests
	WHERE (state = 'done' AND finished_at < now() - $1 * interval '1 microsecond')
	   OR (state = 'running' AND locked_until < now() - $1 * interval '1 microsecond')
	LIMIT $2
	FOR UPDATE SKIP LOCKED)`, retention.Microseconds())
	if err != nil {
		return total, fmt.Errorf("prune API requests: %w", err)
	}
	return total, nil
}
