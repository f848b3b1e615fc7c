package effects

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultLeafWidth is the narrowest leaf: records are partitioned by day
// unless a kind's lifetime asks for wider leaves (see Lifetime.Width).
const DefaultLeafWidth = 24 * time.Hour

// LeavesPerLifetime is how many leaves a kind's lifetime spans unless
// SetLifetimesOpts says otherwise: a kind's leaves are at least
// Keep/LeavesPerLifetime wide, so a claim looks in three or four leaves
// however long its records are kept, and a record is kept at most half its
// lifetime longer than Keep. Each leaf a claim looks in costs it about 5%
// at 32 connections (docs/benchmarks.md).
const LeavesPerLifetime = 2

// MaxLeavesPerLifetime bounds SetLifetimesOpts.LeavesPerLifetime: a claim
// locks every leaf of its kind's class (an untold one also the leaf's
// indexes), so at 16 leaves a claim takes 20 to 50 locks, most in
// Postgres's shared lock table (a backend has 16 fast-path slots).
const MaxLeavesPerLifetime = 16

// ErrLifetime is wrapped by errors for a lifetime table SetLifetimes refuses.
var ErrLifetime = errors.New("effects: bad lifetime")

// Lifetime says how long records of one kind are kept before their leaf is
// dropped. Kind "" covers every kind not listed.
type Lifetime struct {
	Kind string
	// Keep is the least time a record is kept; it is dropped with its leaf
	// at most Keep plus one leaf width after it was created. At least an
	// hour.
	Keep time.Duration
}

// MaxLeafWidth is the widest leaf (the schema's bound): a longer lifetime
// is cut into more leaves.
const MaxLeafWidth = 366 * 24 * time.Hour

// Width is the width of the kind's leaves: Keep/LeavesPerLifetime rounded
// up to whole base widths, at least base (zero means DefaultLeafWidth) and
// at most the whole base widths in MaxLeafWidth.
func (l Lifetime) Width(base time.Duration) time.Duration {
	return l.width(base, LeavesPerLifetime)
}

// width is Keep/perLifetime rounded up to whole base widths, at least base
// and at most the whole base widths in MaxLeafWidth.
func (l Lifetime) width(base time.Duration, perLifetime int) time.Duration {
	if base <= 0 {
		base = DefaultLeafWidth
	}
	n := (l.Keep/time.Duration(perLifetime) + base - 1) / base
	return min(max(n, 1), max(MaxLeafWidth/base, 1)) * base
}

var classPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,23}$`)

// class is the partition class of a kind: the kind itself, "default" for "".
func (l Lifetime) class() (string, error) {
	if l.Kind == "" {
		return "default", nil
	}
	c := strings.ReplaceAll(strings.ToLower(l.Kind), "-", "_")
	if !classPattern.MatchString(c) || c == "default" || c == "legacy" {
		return "", fmt.Errorf("%w: kind %q cannot name a partition (want [a-z][a-z0-9_-]{0,23}, not default or legacy)", ErrLifetime, l.Kind)
	}
	return c, nil
}

// SetLifetimesOpts configures SetLifetimes. A nil *SetLifetimesOpts means
// all defaults.
type SetLifetimesOpts struct {
	// Width is the narrowest leaf. Zero means DefaultLeafWidth.
	Width time.Duration
	// LeavesPerLifetime is how many leaves a kind's lifetime is cut into:
	// more makes each leaf, and so what one DROP frees, smaller, and costs
	// every claim of the kind not told NotBefore one more leaf to look in
	// per leaf. Zero means LeavesPerLifetime; at most MaxLeavesPerLifetime.
	LeavesPerLifetime int
}

// SetLifetimes makes lifetimes the table of kinds and lifetimes
// (keyed_effect_lifetimes) and creates the leaves of new kinds; a changed
// width applies from the end of the kind's existing leaves. It refuses,
// changing nothing, a table without the "" row, a Keep under an hour and a
// kind that cannot name a partition, and opts out of range (ErrLifetime).
// A kind dropped from the table keeps its row, as its leaves hold records.
func (c *Client) SetLifetimes(ctx context.Context, lifetimes []Lifetime, opts *SetLifetimesOpts) error {
	if opts == nil {
		opts = &SetLifetimesOpts{}
	}
	if err := opts.validate(); err != nil {
		return err
	}
	rows, err := lifetimeRows(lifetimes, opts.Width, opts.perLifetimeOr())
	if err != nil {
		return err
	}
	var kinds, classes []string
	var keeps, widths []time.Duration
	for _, r := range rows {
		kinds, classes, keeps, widths = append(kinds, r.Kind), append(classes, r.class), append(keeps, r.Keep), append(widths, r.width)
	}
	if _, err := c.db.Exec(ctx, `SELECT count(*) FROM keyed_effects_set_lifetimes($1, $2, $3, $4, $5)`,
		kinds, classes, keeps, widths, 2*opts.widthOr()); err != nil {
		return fmt.Errorf("set effect lifetimes: %w", err)
	}
	return nil
}

func (o *SetLifetimesOpts) validate() error {
	if o.Width != 0 && (o.Width < time.Hour || o.Width > MaxLeafWidth) {
		return fmt.Errorf("%w: leaf width %s is outside 1h to %s (0 means %s)", ErrLifetime, o.Width, MaxLeafWidth, DefaultLeafWidth)
	}
	if o.LeavesPerLifetime < 0 || o.LeavesPerLifetime > MaxLeavesPerLifetime {
		return fmt.Errorf("%w: %d leaves per lifetime is outside 1 to %d (0 means %d)",
			ErrLifetime, o.LeavesPerLifetime, MaxLeavesPerLifetime, LeavesPerLifetime)
	}
	return nil
}

func (o *SetLifetimesOpts) perLifetimeOr() int {
	if o.LeavesPerLifetime > 0 {
		return o.LeavesPerLifetime
	}
	return LeavesPerLifetime
}

func (o *SetLifetimesOpts) widthOr() time.Duration {
	if o.Width > 0 {
		return o.Width
	}
	return DefaultLeafWidth
}

type lifetimeRow struct {
	Lifetime
	class string
	width time.Duration
}

func lifetimeRows(lifetimes []Lifetime, base time.Duration, perLifetime int) ([]lifetimeRow, error) {
	seen, rows := map[string]bool{}, make([]lifetimeRow, 0, len(lifetimes))
	for _, l := range lifetimes {
		class, err := l.class()
		if err != nil {
			return nil, err
		}
		if l.Keep < time.Hour {
			return nil, fmt.Errorf("%w: kind %q: keep %s is under one hour", ErrLifetime, l.Kind, l.Keep)
		}
		if seen[class] {
			return nil, fmt.Errorf("%w: kind %q is listed twice", ErrLifetime, l.Kind)
		}
		seen[class] = true
		rows = append(rows, lifetimeRow{Lifetime: l, class: class, width: l.width(base, perLifetime)})
	}
	if !seen["default"] {
		return nil, fmt.Errorf("%w: no lifetime for kind \"\" (every kind not listed)", ErrLifetime)
	}
	return rows, nil
}

// Leaf is one partition of effect records: a class's records created in
// [From, To).
type Leaf struct {
	Name  string
	Class string
	From  time.Time
	To    time.Time
	// Keep is the class's lifetime; the leaf may be dropped once To+Keep
	// has passed and it holds no claim in flight.
	Keep time.Duration
}

// Expired reports whether every record in the leaf is past its lifetime at now.
func (l Leaf) Expired(now time.Time) bool { return !l.To.Add(l.Keep).After(now) }

// Leaves lists the leaves of the partitioned table, oldest first within a
// class. The legacy partition (a converted table) is not a leaf; an
// unpartitioned table has none.
func (c *Client) Leaves(ctx context.Context) ([]Leaf, error) {
	rows, err := c.db.Query(ctx, `
SELECT b.leaf, l.class, l.keep, b.lo, b.hi
FROM keyed_effect_lifetimes l, keyed_effects_leaf_bounds('keyed_effects_' || l.class) b
ORDER BY l.class, b.lo`)
	if err != nil {
		return nil, fmt.Errorf("list effect leaves: %w", err)
	}
	leaves, err := pgx.CollectRows(rows, scanLeaf)
	if err != nil {
		return nil, fmt.Errorf("list effect leaves: %w", err)
	}
	return leaves, nil
}

// scanLeaf reads a Leaf from a row of name, class, keep, lower and upper
// bound.
func scanLeaf(r pgx.CollectableRow) (Leaf, error) {
	var l Leaf
	err := r.Scan(&l.Name, &l.Class, &l.Keep, &l.From, &l.To)
	return l, err
}

// EnsureLeaves creates, for every kind's class, the leaves from the one
// holding now-behind to the one holding now+ahead, returns the names of
// those it created, and rewrites the claim function to name them (on a
// schema before effects migration 6 there is nothing to rewrite). Retire
// calls this on the retention schedule, a backfill of old records calls it
// first, and a claim that finds no leaf for now (a retention window that
// has not run) calls it before retrying.
func (c *Client) EnsureLeaves(ctx context.Context, behind, ahead time.Duration) ([]string, error) {
	return ensureLeaves(ctx, c.db, behind, ahead)
}

func ensureLeaves(ctx context.Context, db DB, behind, ahead time.Duration) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT keyed_effects_ensure_leaves($1, $2)`, behind, ahead)
	if err != nil {
		return nil, fmt.Errorf("create effect leaves: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("create effect leaves: %w", err)
	}
	if len(names) > 0 {
		// The claim function names the current and future leaves (effects
		// migration 6): write it again with the new ones.
		_, err := db.Exec(ctx, `SELECT keyed_effects_refresh_claim()`)
		if err != nil && !missingFunction(err, "keyed_effects_refresh_claim(") {
			return names, fmt.Errorf("rewrite the claim for new effect leaves: %w", err)
		}
	}
	return names, nil
}

// Partition converts an unpartitioned keyed_effects in place and reports
// whether it did: the table becomes the partition of class "legacy" and
// new claims go to leaves. Claims keep running; they wait for the brief
// exclusive locks at the end. Records of the legacy partition stay until
// PruneLegacy deletes them. See docs/operating.md for the procedure.
func Partition(ctx context.Context, db MigratorDB) (bool, error) {
	var converted bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT keyed_effects_partition()`).Scan(&converted)
	})
	if err != nil {
		return false, fmt.Errorf("partition keyed_effects: %w", err)
	}
	return converted, nil
}

// RetireOpts configures Retire. A nil *RetireOpts means all defaults.
type RetireOpts struct {
	// Ahead is how far ahead leaves are created. Zero means two days.
	Ahead time.Duration
	// Now is the time leaves are judged at. Zero means time.Now.
	Now time.Time
}

// RetireResult says what Retire did.
type RetireResult struct {
	// Created are the leaves created ahead.
	Created []string
	// Dropped are the expired leaves dropped.
	Dropped []string
	// Blocked are expired leaves kept because they hold a claim in flight,
	// with how many.
	Blocked map[string]int64
	// DropTook is the time spent in the DROP TABLE statements and their
	// commits, which unlink the leaves' files; the rest of a retirement is
	// the detaches and the in-flight checks, which claims do not wait for.
	DropTook time.Duration
}

// Retire creates leaves ahead and drops every leaf whose records are all
// past their lifetime, unless it holds a claim in flight (state claimed),
// which keeps it and is reported in Blocked. A leaf is detached with
// DETACH PARTITION CONCURRENTLY, so claims never wait on it, then checked
// and dropped under one lock (see retireLeaf); one found holding a claim
// is attached back. Retire needs a pool (DETACH CONCURRENTLY runs outside
// a transaction) and does nothing to an unpartitioned table.
func (c *Client) Retire(ctx context.Context, opts *RetireOpts) (*RetireResult, error) {
	if opts == nil {
		opts = &RetireOpts{}
	}
	ahead, now := opts.Ahead, opts.Now
	if ahead <= 0 {
		ahead = 48 * time.Hour
	}
	if now.IsZero() {
		now = time.Now()
	}
	res := &RetireResult{Blocked: map[string]int64{}}
	var err error
	if res.Created, err = c.EnsureLeaves(ctx, 0, ahead); err != nil {
		return res, err
	}
	if err := c.finishDetaches(ctx); err != nil {
		return res, err
	}
	leaves, err := c.Leaves(ctx)
	if err != nil {
		return res, err
	}
	left, err := c.DetachedLeaves(ctx)
	if err != nil {
		return res, err
	}
	for _, l := range append(leaves, left...) {
		if !l.Expired(now) {
			continue
		}
		n, took, err := c.retireLeaf(ctx, l)
		res.DropTook += took
		if err != nil {
			return res, err
		}
		if n > 0 {
			res.Blocked[l.Name] = n
			continue
		}
		res.Dropped = append(res.Dropped, l.Name)
	}
	return res, nil
}

// retireLeaf drops one expired leaf and returns 0 and how long the DROP
// and its commit took, or keeps it and returns how many claims in flight
// it holds. The leaf is detached first, so claims never look in it again;
// then, holding it under an ACCESS EXCLUSIVE lock, which only the leaf's
// own writers (completions and takeovers of its records, named by leaf)
// wait for, it is scanned once for claims in flight and dropped in the
// same transaction, so no record can become a claim between the check and
// the drop. A leaf found holding one is attached back; the CHECK
// constraint the detach added spares the attach its scan.
func (c *Client) retireLeaf(ctx context.Context, l Leaf) (int64, time.Duration, error) {
	db, ok := c.db.(MigratorDB)
	if !ok {
		return 0, 0, wrapRetire(l, errors.New("retire needs a pool, not a transaction"))
	}
	leaf, parent := pgx.Identifier{l.Name}.Sanitize(), pgx.Identifier{"keyed_effects_" + l.Class}.Sanitize()
	if err := c.detach(ctx, parent, leaf); err != nil {
		return 0, 0, wrapRetire(l, err)
	}
	n, took, err := dropUnlessInFlight(ctx, db, leaf)
	if err != nil || n == 0 {
		return n, took, wrapRetire(l, err)
	}
	_, err = c.db.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
		parent, leaf, l.From.UTC().Format(time.RFC3339Nano), l.To.UTC().Format(time.RFC3339Nano)))
	return n, 0, wrapRetire(l, err)
}

// detach detaches a leaf with DETACH PARTITION CONCURRENTLY, unless it is
// detached already (a killed Retire's, see DetachedLeaves).
func (c *Client) detach(ctx context.Context, parent, leaf string) error {
	var attached bool
	if err := c.db.QueryRow(ctx, `SELECT relispartition FROM pg_class WHERE oid = $1::regclass`, leaf).Scan(&attached); err != nil || !attached {
		return err
	}
	_, err := c.db.Exec(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+leaf+` CONCURRENTLY`)
	return err
}

// finishDetaches finishes (DETACH ... FINALIZE) every detach of a leaf that
// a killed Retire left pending: while one is pending, no other leaf of its
// class partition can be detached concurrently.
func (c *Client) finishDetaches(ctx context.Context) error {
	rows, err := c.db.Query(ctx, `
SELECT ARRAY[p.relname::text, l.relname::text]
FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent JOIN pg_class l ON l.oid = i.inhrelid
WHERE i.inhdetachpending AND p.relnamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
    AND p.relname LIKE 'keyed\_effects\_%'`)
	if err != nil {
		return fmt.Errorf("list pending detaches: %w", err)
	}
	pairs, err := pgx.CollectRows(rows, pgx.RowTo[[2]string])
	if err != nil {
		return fmt.Errorf("list pending detaches: %w", err)
	}
	for _, p := range pairs {
		parent, leaf := pgx.Identifier{p[0]}.Sanitize(), pgx.Identifier{p[1]}.Sanitize()
		if _, err := c.db.Exec(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+leaf+` FINALIZE`); err != nil {
			return fmt.Errorf("finish the detach of effect leaf %s: %w", p[1], err)
		}
	}
	return nil
}

// detachedLeavesSQL finds the leaves a killed Retire detached and never
// dropped: tables of this schema, in no partitioned table, whose comment
// names a class and bounds as keyed_effects_leaf_comment writes it.
const detachedLeavesSQL = `
SELECT c.relname::text, m[1], l.keep, m[2]::timestamptz, m[3]::timestamptz
FROM pg_class c
CROSS JOIN LATERAL regexp_match(obj_description(c.oid, 'pg_class'),
    '^keyed effect leaf: class ([a-z][a-z0-9_]*), from (\S+) to (\S+)$') m
JOIN keyed_effect_lifetimes l ON l.class = m[1]
WHERE c.relnamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
    AND c.relkind = 'r' AND NOT c.relispartition AND c.relname LIKE 'keyed\_effects\_%'
ORDER BY 2, 4`

// DetachedLeaves lists the leaves a killed Retire detached and never
// dropped, oldest first within a class; the next Retire drops them, or
// attaches back one that holds a claim in flight. Claims do not look in
// them.
func (c *Client) DetachedLeaves(ctx context.Context) ([]Leaf, error) {
	rows, err := c.db.Query(ctx, detachedLeavesSQL)
	if err != nil {
		return nil, fmt.Errorf("list detached effect leaves: %w", err)
	}
	leaves, err := pgx.CollectRows(rows, scanLeaf)
	if err != nil {
		return nil, fmt.Errorf("list detached effect leaves: %w", err)
	}
	return leaves, nil
}

// dropUnlessInFlight drops a detached leaf in the transaction that found
// it holds no claim in flight, and returns how long the DROP and its
// commit took; otherwise it returns how many it holds and leaves it be.
func dropUnlessInFlight(ctx context.Context, db MigratorDB, leaf string) (int64, time.Duration, error) {
	var n int64
	var start time.Time
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		if n, err = inFlight(ctx, tx, leaf); err != nil || n > 0 {
			return err
		}
		start = time.Now()
		_, err = tx.Exec(ctx, `DROP TABLE `+leaf)
		return err
	})
	if err != nil || n > 0 {
		return n, 0, err
	}
	return 0, time.Since(start), nil
}

// retireChunk is how many blocks of a leaf (64 MiB) inFlight reads at a
// time; it rests as long as each chunk took, so the scan of a month-old
// leaf takes at most half of one core from live claims.
const retireChunk = 8192

// inFlight locks a leaf against its writers and counts its claims in
// flight, scanning it in chunks on one backend (parallel workers would
// take the cores live claims run on).
func inFlight(ctx context.Context, tx pgx.Tx, leaf string) (int64, error) {
	if _, err := tx.Exec(ctx, `SET LOCAL max_parallel_workers_per_gather = 0`); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+leaf+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		return 0, err
	}
	var blocks int64
	err := tx.QueryRow(ctx, `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint`, leaf).Scan(&blocks)
	if err != nil {
		return 0, err
	}
	count := `SELECT count(*) FROM ` + leaf + ` WHERE ctid >= $1::text::tid AND ctid < $2::text::tid AND state = 'claimed'`
	var total int64
	for from := int64(0); from <= blocks; from += retireChunk {
		start := time.Now()
		var n int64
		if err := tx.QueryRow(ctx, count, fmt.Sprintf("(%d,0)", from), fmt.Sprintf("(%d,0)", from+retireChunk)).Scan(&n); err != nil {
			return 0, err
		}
		total += n
		if from+retireChunk > blocks {
			break // no rest after the last chunk: the lock is still held
		}
		if err := rest(ctx, time.Since(start)); err != nil {
			return 0, err
		}
	}
	return total, nil
}

// rest waits d or until ctx is done.
func rest(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func wrapRetire(l Leaf, err error) error {
	if err != nil {
		return fmt.Errorf("retire effect leaf %s: %w", l.Name, err)
	}
	return nil
}
