package effects

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// claimLeafSQL claims a fresh key of a told claim by inserting into a leaf
// by name (%[1]s; its class and name as literals, %[2]s and %[3]s), under
// the key's lock, with no PL/pgSQL call (effects migration 7). It inserts
// only if keyed_effects_claim_leaf says the claim function would have taken
// this leaf's shortcut, and on a conflict it returns no row: either way the
// caller then claims through the function. %[4]s is the kind the guard
// judges: a literal for a kind the picture lists, $3 for the others, which
// the guard must judge by name. %[5]s is empty, or for an AsyncCommit claim
// turns synchronous_commit off for the statement's transaction. The class,
// the leaf and a listed kind are literals, not parameters: Postgres then
// folds the inlined guard to that leaf's branch when it plans the
// statement and builds only that branch on each execution, where
// parameters made it plan every execution anew, 13% of the statement's
// cost, and a parameter kind made it build every kind's branch.
const claimLeafSQL = `
INSERT INTO %[1]s AS e (key, tenant_id, kind, class, state, owner, fingerprint, lease_until)
SELECT $1, $2, $3, %[2]s, 'claimed', $4, $5, now() + $6 * interval '1 microsecond'
FROM (SELECT pg_advisory_xact_lock(1801, hashtext($1))) lk
WHERE keyed_effects_claim_leaf(%[4]s, %[2]s, %[3]s, $7)%[5]s
ON CONFLICT DO NOTHING
RETURNING e.generation, e.attempts, e.lease_until, e.created_at`

// asyncCommitSQL is claimLeafSQL's clause for an AsyncCommit claim.
const asyncCommitSQL = `
  AND set_config('synchronous_commit', 'off', true) IS NOT NULL`

// plainName matches the kind, class and leaf names claimLeafSQL spells as
// literals and identifiers; a leaf named otherwise is claimed through the
// function, a kind named otherwise is judged as a parameter.
var plainName = regexp.MustCompile(`^[a-z0-9_]+$`)

// newClaimLeaf returns the picture's entry for a leaf of kind (the
// picture's row; "" stands for every kind not listed), or false for a name
// claimLeafSQL does not spell.
func newClaimLeaf(kind, class, name string, lo, hi time.Time) (claimLeaf, bool) {
	if !plainName.MatchString(class) || !plainName.MatchString(name) {
		return claimLeaf{}, false
	}
	judged := "$3"
	if plainName.MatchString(kind) {
		judged = "'" + kind + "'"
	}
	sql := func(async string) string {
		return fmt.Sprintf(claimLeafSQL, name, "'"+class+"'", "'"+name+"'", judged, async)
	}
	return claimLeaf{class: class, name: name, lo: lo, hi: hi, sql: sql(""), asyncSQL: sql(asyncCommitSQL)}, true
}

// leafPictureAge is how long a client uses its picture of the leaves before
// reading it again. A stale picture costs a claim its shortcut, never its
// correctness: the guard in the statement decides.
const leafPictureAge = time.Minute

// leafPicture is keyed_effects_claim_leaves() as read at one time: for each
// kind of the lifetimes, the leaves a told claim may insert into first
// (none while its look-up reads more than its class); kinds not listed take
// the leaves of "".
type leafPicture struct {
	at     time.Time
	leaves map[string][]claimLeaf
}

// claimLeaf is one leaf of a picture, with its bounds and claimLeafSQL
// naming it, for a claim and for an AsyncCommit claim.
type claimLeaf struct {
	class, name   string
	lo, hi        time.Time
	sql, asyncSQL string
}

// leafCache holds a Client's picture of the leaves.
type leafCache struct {
	pic     atomic.Pointer[leafPicture]
	reading sync.Mutex
}

// pick returns the leaf that holds every record a claim of kind told
// notBefore can meet at now, as the guard will judge it (with a minute's
// margin for clocks), or false.
func (pic *leafPicture) pick(kind string, notBefore, now time.Time) (claimLeaf, bool) {
	leaves, ok := pic.leaves[kind]
	if !ok {
		leaves = pic.leaves[""]
	}
	from := min(notBefore.UnixMicro(), now.UnixMicro()) - time.Hour.Microseconds()
	edge := now.Add(time.Hour + time.Minute)
	for _, l := range leaves {
		if from >= l.lo.UnixMicro() && !now.Before(l.lo) && edge.Before(l.hi) {
			return l, true
		}
	}
	return claimLeaf{}, false
}

// readLeafPicture reads keyed_effects_claim_leaves().
func readLeafPicture(ctx context.Context, db DB) (*leafPicture, error) {
	rows, err := db.Query(ctx, `SELECT kind, class, leaf, lo, hi FROM keyed_effects_claim_leaves()`)
	if err != nil {
		return nil, fmt.Errorf("read the claim's leaves: %w", err)
	}
	pic := &leafPicture{at: time.Now(), leaves: map[string][]claimLeaf{}}
	var kind, class string
	var leaf *string
	var lo, hi *time.Time
	_, err = pgx.ForEachRow(rows, []any{&kind, &class, &leaf, &lo, &hi}, func() error {
		// Every row lists its kind; only a leaf claimLeafSQL can name adds
		// to it (a NULL leaf: none to insert into first).
		leaves := pic.leaves[kind]
		if leaf != nil && lo != nil && hi != nil {
			if l, ok := newClaimLeaf(kind, class, *leaf, *lo, *hi); ok {
				leaves = append(leaves, l)
			}
		}
		pic.leaves[kind] = leaves
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the claim's leaves: %w", err)
	}
	return pic, nil
}

// picture returns c's picture of the leaves, read again through the pool
// once it is leafPictureAge old, by one caller at a time. Inside a caller's
// transaction (db is not c's pool) it never reads: that would wait for a
// second connection while holding one. A failed read leaves an empty
// picture until the next: claims go through the function.
func (c *Client) picture(ctx context.Context, db DB) *leafPicture {
	pic := c.leaves.pic.Load()
	if (pic != nil && time.Since(pic.at) < leafPictureAge) || db != c.db || !c.leaves.reading.TryLock() {
		return pic
	}
	defer c.leaves.reading.Unlock()
	fresh, err := readLeafPicture(ctx, c.db)
	if err != nil {
		c.logger.LogAttrs(ctx, slog.LevelDebug, "effect claims go through the claim function",
			slog.String("reason", err.Error()))
		fresh = &leafPicture{at: time.Now()}
	}
	c.leaves.pic.Store(fresh)
	return fresh
}

// claimFromGo claims p.Key with claimLeafSQL when p is told, not a Repeat,
// and c's picture names a leaf for it. It returns a new claim, or nil and
// no error when the caller must claim through the function: no leaf, a
// guard that refused, a conflict. A leaf the picture names that is gone drops the picture; inside
// a caller's transaction, whose failed statement aborted it, that is a
// transient error.
func (c *Client) claimFromGo(ctx context.Context, db DB, p ClaimParams, lease time.Duration) (*Claim, error) {
	if p.NotBefore.IsZero() || p.Repeat {
		return nil, nil
	}
	pic := c.picture(ctx, db)
	if pic == nil {
		return nil, nil
	}
	l, ok := pic.pick(p.Kind, p.NotBefore, time.Now())
	if !ok {
		return nil, nil
	}
	cl := &Claim{Key: p.Key, Kind: p.Kind, Owner: p.Owner, Mode: ModeNew, maxResult: p.MaxResultBytes, leaf: l.name}
	sql := l.sql
	if p.AsyncCommit {
		sql = l.asyncSQL
	}
	err := db.QueryRow(ctx, sql, p.Key.String(), p.Key.Tenant(), p.Kind, p.Owner, p.Fingerprint,
		lease.Microseconds(), notBefore(p)).Scan(&cl.Generation, &cl.Attempt, &cl.LeaseUntil, &cl.createdAt)
	switch {
	case err == nil:
		return cl, nil
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case staleLeaf(err):
		c.leaves.pic.Store(&leafPicture{})
		if db != c.db {
			return nil, Transient(fmt.Errorf("claim %s: %w", p.Key, err))
		}
		return nil, nil
	}
	return nil, fmt.Errorf("claim %s: %w", p.Key, err)
}

// staleLeaf reports an error of claimLeafSQL from a picture the schema no
// longer matches: its leaf or the guard is gone.
func staleLeaf(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883")
}
