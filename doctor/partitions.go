package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keyedhq/keyed/effects"
)

// partitionsAhead is how far ahead every class's leaves must reach; the
// retention schedule creates two days ahead.
const partitionsAhead = 24 * time.Hour

// partitions checks the effect records' layout: fails when keyed_effects is
// not partitioned (fix: starter effects partition), warns per class whose
// leaves end less than a day ahead (claims would fail once they end) and
// per leaf past its lifetime that claims in flight keep from being dropped,
// per class whose largest leaf is over Opts.LeafLimit, per class with
// leaves an interrupted Retire detached and left, and when a read of every
// leaf takes more locks than max_locks_per_transaction.
func (r *run) partitions(ctx context.Context) []Check {
	c, err := effects.NewClient(r.deps.Pool, nil)
	if err != nil {
		return []Check{errorCheck(CheckPartitions, "keyed_effects", err, "")}
	}
	leaves, err := c.Leaves(ctx)
	if err != nil {
		return []Check{errorCheck(CheckPartitions, "keyed_effects", err, "check DATABASE_URL and the effects migrations")}
	}
	if len(leaves) == 0 {
		return []Check{{Name: CheckPartitions, Subject: "keyed_effects", Status: StatusWarn,
			Evidence: "keyed_effects is not partitioned: retention deletes records one by one",
			Fix:      "run `starter migrate --partition` (online; see docs/operating.md)"}}
	}
	var out []Check
	classes := byClass(leaves)
	locks, err := r.leafLocks(ctx, len(leaves), len(classes))
	if err != nil {
		return []Check{errorCheck(CheckPartitions, "keyed_effects", err, "")}
	}
	if locks != nil {
		out = append(out, *locks)
	}
	for class, ls := range classes {
		out = append(out, r.classLeaves(ctx, class, ls)...)
	}
	left, err := c.DetachedLeaves(ctx)
	if err != nil {
		return append(out, errorCheck(CheckPartitions, "keyed_effects", err, ""))
	}
	for class, ls := range byClass(left) {
		names := make([]string, len(ls))
		for i, l := range ls {
			names[i] = l.Name
		}
		out = append(out, Check{Name: CheckPartitions, Subject: "keyed_effects_" + class, Status: StatusWarn,
			Evidence: "detached by an interrupted retirement and not dropped: " + strings.Join(names, ", "),
			Fix:      "the next retention window (PRUNE_EVERY) drops them, or attaches back one holding a claim in flight; check that a worker runs it"})
	}
	return out
}

func byClass(leaves []effects.Leaf) map[string][]effects.Leaf {
	m := map[string][]effects.Leaf{}
	for _, l := range leaves {
		m[l.Class] = append(m[l.Class], l)
	}
	return m
}

func (r *run) classLeaves(ctx context.Context, class string, ls []effects.Leaf) []Check {
	subject := "keyed_effects_" + class
	last := ls[len(ls)-1]
	ahead := last.To.Sub(r.now)
	c := Check{Name: CheckPartitions, Subject: subject, Status: StatusPass, Evidence: fmt.Sprintf(
		"%d leaves, kept %s, the newest ends %s ahead", len(ls), days(last.Keep), days(ahead.Round(time.Hour)))}
	if ahead < partitionsAhead {
		c.Status, c.Fix = StatusWarn, "check that a worker runs the retention schedule (PRUNE_EVERY); its window creates leaves two days ahead"
		c.Evidence = fmt.Sprintf("the newest leaf ends %s ahead, less than %s: claims of this class fail once it ends",
			days(ahead.Round(time.Hour)), days(partitionsAhead))
	}
	out := []Check{c}
	big, err := r.largestLeaf(ctx, subject, ls)
	if err != nil {
		return append(out, errorCheck(CheckPartitions, subject, err, ""))
	}
	if big != nil {
		out = append(out, *big)
	}
	var blocked []string
	for _, l := range ls {
		if !l.Expired(r.now) {
			continue
		}
		var n int64
		if err := r.deps.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{l.Name}.Sanitize()+` WHERE state = 'claimed'`).Scan(&n); err != nil {
			return append(out, errorCheck(CheckPartitions, l.Name, err, ""))
		}
		blocked = append(blocked, fmt.Sprintf("%s (%d claims in flight)", l.Name, n))
	}
	if len(blocked) == 0 {
		return out
	}
	return append(out, Check{Name: CheckPartitions, Subject: subject, Status: StatusWarn,
		Evidence: "past their lifetime but kept: " + strings.Join(blocked, ", "),
		Fix:      "a leaf with claims in flight is never dropped: finish or resolve those runs (`starter attention`), then the next retention window drops it"})
}

// largestLeaf warns of a class whose largest leaf is over Opts.LeafLimit:
// its DROP frees that much at once, and the file system's unlink holds up
// every WAL flush meanwhile (docs/operating.md, "Sizing leaves").
func (r *run) largestLeaf(ctx context.Context, subject string, ls []effects.Leaf) (*Check, error) {
	names := make([]string, len(ls))
	for i, l := range ls {
		names[i] = pgx.Identifier{l.Name}.Sanitize()
	}
	var i int
	var size int64
	if err := r.deps.Pool.QueryRow(ctx, `SELECT i, pg_total_relation_size(l::regclass) FROM unnest($1::text[]) WITH ORDINALITY AS u(l, i)
		ORDER BY 2 DESC LIMIT 1`, names).Scan(&i, &size); err != nil {
		return nil, fmt.Errorf("size effect leaves: %w", err)
	}
	if size <= r.o.LeafLimit {
		return nil, nil
	}
	big := ls[i-1]
	return &Check{Name: CheckPartitions, Subject: subject, Status: StatusWarn,
		Evidence: fmt.Sprintf("leaf %s holds %s, over %s: retiring it frees that at once, and writes wait while the file system unlinks it",
			big.Name, bytesText(size), bytesText(r.o.LeafLimit)),
		Fix: leavesFix(big, size, r.o.LeafLimit)}, nil
}

// leavesFix says how many leaves a lifetime would keep leaves of big's
// class under limit at big's rate of records.
func leavesFix(big effects.Leaf, size, limit int64) string {
	now := max(int64(big.Keep/big.To.Sub(big.From)), 1)
	want := (now*size + limit - 1) / limit
	if want > effects.MaxLeavesPerLifetime {
		return fmt.Sprintf("even %d leaves a lifetime (EFFECTS_LEAVES_PER_LIFETIME) leave them over the limit at this rate: shorten the kind's lifetime, "+
			"and mount Postgres's data without online discard (docs/operating.md, \"Sizing leaves\")", effects.MaxLeavesPerLifetime)
	}
	return fmt.Sprintf("set EFFECTS_LEAVES_PER_LIFETIME to %d or more on the workers (these leaves are about %d a lifetime); the leaves made from then on are narrower (docs/operating.md, \"Sizing leaves\")",
		want, now)
}

// bytesText writes n in GiB, MiB or KiB, whichever it reaches.
func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
}

// leafLocks warns when a read of every leaf (List, Get: an order's effects,
// a key looked up that has no record) takes more relation locks than
// max_locks_per_transaction: a leaf and its two indexes, each class
// partition and keyed_effects. Postgres's lock table holds that many per
// connection, so as many such reads at once as it allows connections
// could exhaust it, failing every client with "out of shared memory".
func (r *run) leafLocks(ctx context.Context, leaves, classes int) (*Check, error) {
	need := 3*leaves + classes + 1
	var most int
	if err := r.deps.Pool.QueryRow(ctx, `SELECT current_setting('max_locks_per_transaction')::int`).Scan(&most); err != nil {
		return nil, fmt.Errorf("read max_locks_per_transaction: %w", err)
	}
	if need <= most {
		return nil, nil
	}
	return &Check{Name: CheckPartitions, Subject: "keyed_effects", Status: StatusWarn,
		Evidence: fmt.Sprintf("a read of every leaf (an order's effects, a key looked up that has no record) takes %d locks, over max_locks_per_transaction %d: "+
			"enough such reads at once exhaust Postgres's lock table, failing every client with \"out of shared memory\"", need, most),
		Fix: fmt.Sprintf("set max_locks_per_transaction to at least %d (it needs a restart), or lower EFFECTS_LEAVES_PER_LIFETIME (docs/operating.md, \"Sizing leaves\")",
			(need+15)/16*16)}, nil
}
