package effects_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

// BenchmarkClaimComplete measures claim plus complete of fresh keys through
// the Client on the partitioned layout (the lifetimes keyed sets, with a
// lifetime's worth of leaves; claims as the charge step sends them, told
// NotBefore and committed without waiting for the WAL flush) and on an
// unpartitioned table (committed alike), and the bare two SQL statements
// through raw pgx on an unpartitioned table of their own, at 1, 8 and 32
// connections, alternating in the same run, each side on its own pool. It
// reports the three rates, part/plain (the cost of partitioning; target
// 0.95) and part/raw. (With raw sharing the unpartitioned side's pool, that
// pool's backends ran two chunks in three and the partitioned side's one,
// which cost part/plain 0.1 at 32.) BenchmarkClaimCompleteLeaf splits
// part/raw in two; BenchmarkLeavesPerLifetime sets told claims beside
// untold ones. Three sides of 32 connections are as many as a Postgres
// with the default 100 connections can serve.
func BenchmarkClaimComplete(b *testing.B) {
	for _, conns := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			ctx := context.Background()
			// Each side has a pool (and a table) of its own, so that each
			// pool's backends idle as long between their chunks.
			part := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: int32(conns)})
			plain := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: int32(conns), Unpartitioned: true})
			bare := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: int32(conns), Unpartitioned: true})
			partClient, plainClient := benchClient(b, part), benchClient(b, plain)
			benchLeaves(b, part, partClient, nil)
			var seq atomic.Int64
			raw := func() error {
				return rawClaimComplete(ctx, bare, "keyed_effects", "legacy", fmt.Sprintf("bench:order:%d:charge", seq.Add(1)))
			}
			ops := []func() error{claimAsCharge(partClient, &seq), claimCompleteWith(plainClient, &seq, effects.ClaimParams{AsyncCommit: true}, false), raw}
			warmUp(b, conns, ops, part, plain, bare)
			reportSides(b, alternateRounds(b, conns, ops), []string{"keyed", "plain", "raw"},
				map[string][2]int{"part/plain": {0, 1}, "keyed/raw": {0, 2}})
		})
	}
}

// BenchmarkClaimCompleteLeaf splits the synchronous claim's keyed/raw (a
// told claim that waits for its flush, as a library caller's claim does by
// default) in two with a third side: raw's two statements sent to the
// current charge leaf of a partitioned table by name, as the Client's claim
// from Go sends its own. It reports keyed/leaf (what a claim adds to the
// bare statements on the same layout: the key's lock, the leaf's guard,
// the fenced completion) and leaf/raw (what the leaf costs the bare
// statements), at 1, 8 and 32 connections, alternating, each side on its
// own pool.
func BenchmarkClaimCompleteLeaf(b *testing.B) {
	for _, conns := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			ctx := context.Background()
			part := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: int32(conns)})
			leafPool := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: int32(conns)})
			bare := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: int32(conns), Unpartitioned: true})
			partClient := benchClient(b, part)
			benchLeaves(b, part, partClient, nil)
			benchLeaves(b, leafPool, benchClient(b, leafPool), nil)
			leaf := currentLeaf(b, leafPool, "charge")
			var seq atomic.Int64
			key := func() string { return fmt.Sprintf("bench:order:%d:charge", seq.Add(1)) }
			ops := []func() error{
				claimCompleteTold(partClient, &seq, true),
				func() error { return rawClaimComplete(ctx, leafPool, leaf, "charge", key()) },
				func() error { return rawClaimComplete(ctx, bare, "keyed_effects", "legacy", key()) },
			}
			warmUp(b, conns, ops, part, leafPool, bare)
			reportSides(b, alternateRounds(b, conns, ops), []string{"keyed", "leaf", "raw"},
				map[string][2]int{"keyed/leaf": {0, 1}, "leaf/raw": {1, 2}, "keyed/raw": {0, 2}})
		})
	}
}

// BenchmarkClaimStatementSplit prices the parts of the claim's insert
// from Go on one connection with synchronous_commit off, so that no WAL
// flush hides a statement's own cost: the bare insert into the current
// charge leaf, the same under the key's lock, under the guard with the
// kind as a parameter and as a literal, and the shipped statement for a
// claim and for an AsyncCommit claim. Each side's insert is followed by
// the same completion, alternating in chunks of 250; it reports µs per
// pair of each side and each side's µs beyond the bare insert's.
func BenchmarkClaimStatementSplit(b *testing.B) {
	ctx := context.Background()
	pool := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: 1})
	benchLeaves(b, pool, benchClient(b, pool), nil)
	_, err := pool.Exec(ctx, `SET synchronous_commit = off`)
	require.NoError(b, err)
	leaf := currentLeaf(b, pool, "charge")
	insert := func(from, where string) string {
		return `INSERT INTO ` + leaf + ` AS e (key, tenant_id, kind, class, state, owner, fingerprint, lease_until)
SELECT $1, $2, $3, 'charge', 'claimed', $4, $5, now() + $6 * interval '1 microsecond'` + from + ` WHERE ` + where + `
ON CONFLICT DO NOTHING RETURNING e.generation, e.attempts, e.lease_until, e.created_at`
	}
	const lock, told = ` FROM (SELECT pg_advisory_xact_lock(1801, hashtext($1))) lk`, `$7::timestamptz IS NOT NULL`
	guard := func(kind string) string {
		return fmt.Sprintf(`keyed_effects_claim_leaf(%s, 'charge', '%s', $7)`, kind, leaf)
	}
	sides := []struct{ name, sql string }{
		{"bare", insert("", told)},
		{"lock", insert(lock, told)},
		{"guard_param", insert("", guard("$3"))},
		{"guard", insert("", guard("'charge'"))},
		{"shipped", effects.ClaimLeafSQLForTest("charge", "charge", leaf, false)},
		{"shipped_async", effects.ClaimLeafSQLForTest("charge", "charge", leaf, true)},
	}
	var seq atomic.Int64
	notBefore := time.Now().Add(-time.Second)
	ops := make([]func() error, len(sides))
	for i, side := range sides {
		ops[i] = func() error {
			key := fmt.Sprintf("bench:order:%d:charge", seq.Add(1))
			var gen int64
			var attempts int
			var lease, created time.Time
			if err := pool.QueryRow(ctx, side.sql, key, "bench", "charge", "bench", "", int64(300_000_000), notBefore).
				Scan(&gen, &attempts, &lease, &created); err != nil {
				return fmt.Errorf("%s: %w", side.name, err)
			}
			_, err := pool.Exec(ctx, `UPDATE `+leaf+`
SET state = 'succeeded', result = $3, lease_until = NULL, finished_at = now(), updated_at = now()
WHERE key = $1 AND generation = $2 AND owner = $4 AND state = 'claimed' AND created_at = $5`,
				key, gen, []byte(`{"amount":500,"id":"pi_123"}`), "bench", created)
			return err
		}
	}
	warmUp(b, 1, ops, pool)
	took := alternate(b, 1, ops)
	us := func(i int) float64 { return float64(took[i].Nanoseconds()) / float64(b.N) / 1e3 }
	for i, side := range sides {
		b.ReportMetric(us(i), side.name+"_us")
		if i > 0 {
			b.ReportMetric(us(i)-us(0), side.name+"-bare_us")
		}
	}
}

// reportSides reports each side's rate, as NAME_ops/s, from the time its
// b.N operations took over the rounds of alternateRounds, each named ratio
// of two sides' rates, and, as NAME_med, the median of that ratio taken
// round by round, which a swing of the VM's speed between rounds moves
// less.
func reportSides(b *testing.B, rounds [][]time.Duration, names []string, ratios map[string][2]int) {
	took := totals(rounds)
	rate := func(i int) float64 { return float64(b.N) / took[i].Seconds() }
	for i, name := range names {
		b.ReportMetric(rate(i), name+"_ops/s")
	}
	for name, r := range ratios {
		b.ReportMetric(rate(r[0])/rate(r[1]), name)
		per := make([]float64, len(rounds[r[0]]))
		for k := range per {
			per[k] = rounds[r[1]][k].Seconds() / rounds[r[0]][k].Seconds()
		}
		slices.Sort(per)
		b.ReportMetric((per[(len(per)-1)/2]+per[len(per)/2])/2, name+"_med")
	}
}

// BenchmarkList prices List's statement against the starts_with condition
// it used before, on one connection, alternating in chunks of 250, on the
// leaves a deployment has at 2 (the default) and 16 leaves per lifetime
// with 200 000 charges in them: an order's three records, read back. A starts_with with a parameter is
// planned anew on every call (only a constant prefix becomes an index
// range), and planning a statement over every leaf is most of its cost.
// It reports µs per List of each and their ratio.
func BenchmarkList(b *testing.B) {
	const startsWith = `SELECT key, state, created_at FROM keyed_effects
		WHERE tenant_id = $1 AND starts_with(key, $2) ORDER BY created_at, key`
	for _, n := range []int{effects.LeavesPerLifetime, effects.MaxLeavesPerLifetime} {
		b.Run(fmt.Sprintf("leaves_per_lifetime=%d", n), func(b *testing.B) {
			ctx := context.Background()
			pool := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: 1})
			c := benchClient(b, pool)
			benchLeaves(b, pool, c, &effects.SetLifetimesOpts{LeavesPerLifetime: n})
			prefix := effects.MustKey("acme", "order", "1")
			for _, k := range []string{"charge", "receipt", "refund_stripe"} {
				cl, err := c.Claim(ctx, effects.ClaimParams{Key: effects.MustKey("acme", "order", "1", k), Owner: "o"})
				require.NoError(b, err)
				require.NoError(b, c.Complete(ctx, cl, "ok"))
			}
			ops := []func() error{
				func() error { return readThree(c.List(ctx, prefix)) },
				func() error {
					rows, err := pool.Query(ctx, startsWith, prefix.Tenant(), prefix.String()+effects.Separator)
					if err != nil {
						return err
					}
					n, err := pgx.CollectRows(rows, func(pgx.CollectableRow) (int, error) { return 1, nil })
					return readThree(make([]*effects.Record, len(n)), err)
				},
			}
			warmUp(b, 1, ops, pool)
			took := alternate(b, 1, ops)
			us := func(i int) float64 { return float64(took[i].Microseconds()) / float64(b.N) }
			b.ReportMetric(us(0), "list_us")
			b.ReportMetric(us(1), "starts_with_us")
			b.ReportMetric(us(1)/us(0), "starts_with/list")
		})
	}
}

// readThree returns err, or an error unless recs holds three records.
func readThree(recs []*effects.Record, err error) error {
	if err == nil && len(recs) != 3 {
		err = fmt.Errorf("%d records, want 3", len(recs))
	}
	return err
}

// claimCompleteTold claims and completes a fresh charge key through c, its
// claims told NotBefore when told: a second ago, as for an order created
// just before its charge (the benchmark's keys are fresh, so the bound
// hides nothing).
func claimCompleteTold(c *effects.Client, seq *atomic.Int64, told bool) func() error {
	return claimCompleteWith(c, seq, effects.ClaimParams{}, told)
}

// claimAsCharge is claimCompleteTold as the charge step claims: told, and
// committing the claim without waiting for the WAL flush (AsyncCommit;
// docs/design.md, "A claim that need not be flushed").
func claimAsCharge(c *effects.Client, seq *atomic.Int64) func() error {
	return claimCompleteWith(c, seq, effects.ClaimParams{AsyncCommit: true}, true)
}

// claimCompleteWith is claimCompleteTold with p's options.
func claimCompleteWith(c *effects.Client, seq *atomic.Int64, p effects.ClaimParams, told bool) func() error {
	return func() error {
		ctx := context.Background()
		q := p // each call its own copy: calls run concurrently
		q.Key, q.Owner = effects.MustKey("bench", "order", fmt.Sprint(seq.Add(1)), "charge"), "bench"
		if told {
			q.NotBefore = time.Now().Add(-time.Second)
		}
		cl, err := c.Claim(ctx, q)
		if err != nil {
			return err
		}
		return c.Complete(ctx, cl, map[string]any{"id": "pi_123", "amount": 500})
	}
}

// alternate times b.N runs of each op at conns connections, in chunks of
// 250, rotating which op goes first, so that all see the same table size,
// cache and machine load; it returns each op's total time.
func alternate(b *testing.B, conns int, ops []func() error) []time.Duration {
	return totals(alternateRounds(b, conns, ops))
}

// alternateRounds is alternate, returning each op's time in each round.
func alternateRounds(b *testing.B, conns int, ops []func() error) [][]time.Duration {
	b.ResetTimer()
	const chunk = 250
	rounds := make([][]time.Duration, len(ops))
	for round, done := 0, 0; done < b.N; round++ {
		n := min(chunk, b.N-done)
		for i := range ops {
			j := (i + round) % len(ops)
			rounds[j] = append(rounds[j], runConcurrent(b, conns, n, ops[j]))
		}
		done += n
	}
	b.StopTimer()
	return rounds
}

// totals sums each op's rounds.
func totals(rounds [][]time.Duration) []time.Duration {
	took := make([]time.Duration, len(rounds))
	for i, r := range rounds {
		for _, d := range r {
			took[i] += d
		}
	}
	return took
}

// benchLifetimes is the table a worker sets with the default settings.
var benchLifetimes = []effects.Lifetime{
	{Kind: "", Keep: effects.DefaultRetention},
	{Kind: "charge", Keep: 180 * 24 * time.Hour},
	{Kind: "refund_stripe", Keep: 180 * 24 * time.Hour},
	{Kind: "api_request", Keep: 24 * time.Hour},
}

// benchLeaves sets benchLifetimes and makes the leaves a deployment has
// after running for a lifetime: each class's leaves back over its keep
// plus a width, the rest retired, and the lifetime rows older than an hour
// (so that a claim looks only in its kind's class).
func benchLeaves(b *testing.B, pool *pgxpool.Pool, c *effects.Client, opts *effects.SetLifetimesOpts) {
	ctx := context.Background()
	require.NoError(b, c.SetLifetimes(ctx, benchLifetimes, opts))
	_, err := pool.Exec(ctx, `UPDATE keyed_effect_lifetimes SET since = since - interval '2 hours'`)
	require.NoError(b, err)
	require.NoError(b, c.SetLifetimes(ctx, benchLifetimes, opts))
	_, err = c.EnsureLeaves(ctx, 180*24*time.Hour+45*24*time.Hour, 0)
	require.NoError(b, err)
	_, err = c.Retire(ctx, nil)
	require.NoError(b, err)
	leaves, err := c.Leaves(ctx)
	require.NoError(b, err)
	b.ReportMetric(float64(len(leaves)), "leaves")
}

// BenchmarkLeavesPerLifetime prices EFFECTS_LEAVES_PER_LIFETIME: claim
// plus complete of fresh charges through the Client on partitioned tables
// cut into 2 (the default), 6 and 16 leaves per lifetime, at 8
// connections, alternating in the same run as BenchmarkClaimComplete does,
// each side on its own pool, with claims not told NotBefore, which look in
// every leaf of the charge class (3, 7 and 17 for a charge kept 180 days),
// and told, as the pipeline's are, which look in the newest one or two.
// It reports each side's rate over the default's untold.
func BenchmarkLeavesPerLifetime(b *testing.B) {
	const conns = 8
	sides := []struct {
		leaves int
		told   bool
	}{
		{effects.LeavesPerLifetime, false}, {6, false}, {effects.MaxLeavesPerLifetime, false},
		{effects.LeavesPerLifetime, true}, {6, true}, {effects.MaxLeavesPerLifetime, true},
	}
	var seq atomic.Int64
	ops := make([]func() error, len(sides))
	pools := make([]*pgxpool.Pool, len(sides))
	for i, side := range sides {
		pools[i] = effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: conns})
		c := benchClient(b, pools[i])
		benchLeaves(b, pools[i], c, &effects.SetLifetimesOpts{LeavesPerLifetime: side.leaves})
		ops[i] = claimCompleteTold(c, &seq, side.told)
	}
	warmUp(b, conns, ops, pools...)
	took := alternate(b, conns, ops)
	for i, side := range sides[1:] {
		name := fmt.Sprintf("%d/%d", side.leaves, sides[0].leaves)
		if side.told {
			name = fmt.Sprintf("%dtold/%d", side.leaves, sides[0].leaves)
		}
		b.ReportMetric(took[0].Seconds()/took[i+1].Seconds(), name)
	}
	b.ReportMetric(float64(b.N)/took[0].Seconds(), "ops/s")
}

// benchPreload is how many finished records each table holds before the
// timed part: enough that the records a run adds (up to 3 x b.N) stay under
// the 10% that sets off an autovacuum ANALYZE.
const benchPreload = 200_000

// warmUp loads benchPreload finished charge records into each pool's
// table, runs each op a few thousand times, then analyses the tables, so
// that the timed part sees what a running deployment does: sessions with
// their plans made, and statistics that do not change with every few
// hundred rows. On a small table every autovacuum ANALYZE invalidates every
// session's plans that name it, and the replans, not the claims, would be
// what is measured.
func warmUp(b *testing.B, conns int, ops []func() error, pools ...*pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	for _, pool := range pools {
		_, err := pool.Exec(ctx, `
INSERT INTO keyed_effects (key, tenant_id, kind, class, state, owner, result, finished_at)
SELECT 'preload:order:' || i || ':charge', 'preload', 'charge',
    CASE WHEN (SELECT relkind FROM pg_class WHERE oid = 'keyed_effects'::regclass) = 'p' THEN 'charge' ELSE 'legacy' END,
    'succeeded', 'bench', '{"amount":500,"id":"pi_123"}', now()
FROM generate_series(1, $1) i`, benchPreload)
		require.NoError(b, err)
	}
	for _, op := range ops {
		runConcurrent(b, conns, 2000, op)
	}
	for _, pool := range pools {
		_, err := pool.Exec(ctx, `VACUUM ANALYZE keyed_effects`)
		require.NoError(b, err)
	}
}

func benchClient(b *testing.B, pool *pgxpool.Pool) *effects.Client {
	metrics, err := effects.NewMetrics(prometheus.NewRegistry())
	require.NoError(b, err)
	// Logging is switched off: the benchmark measures the library, not a
	// log handler's formatting.
	return effectstest.NewClient(b, pool, &effects.ClientOpts{Metrics: metrics, Logger: slog.New(slog.DiscardHandler)})
}

func runConcurrent(b *testing.B, workers, n int, op func() error) time.Duration {
	var wg sync.WaitGroup
	var next atomic.Int64
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := op(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// rawClaimComplete is the baseline: the plain claim INSERT (the Client's
// claim statement wraps it so that it also reads an existing record in the
// same round trip) and the completing UPDATE the Client sends, without
// anything around them, into table with the records' class (an
// unpartitioned table's is "legacy"; a leaf's, its class).
func rawClaimComplete(ctx context.Context, pool *pgxpool.Pool, table, class, key string) error {
	var gen int64
	var attempts int
	var lease time.Time
	table = pgx.Identifier{table}.Sanitize()
	err := pool.QueryRow(ctx, `
INSERT INTO `+table+` (key, tenant_id, kind, class, state, owner, fingerprint, lease_until)
VALUES ($1, $2, $3, $4, 'claimed', $5, $6, now() + $7 * interval '1 microsecond')
ON CONFLICT (key) DO NOTHING
RETURNING generation, attempts, lease_until`, key, "bench", "charge", class, "bench", "", int64(300_000_000)).Scan(&gen, &attempts, &lease)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `
UPDATE `+table+`
SET state = 'succeeded', result = $3, lease_until = NULL, finished_at = now(), updated_at = now()
WHERE key = $1 AND generation = $2 AND state = 'claimed'`, key, gen, []byte(`{"amount":500,"id":"pi_123"}`))
	return err
}

// currentLeaf names the leaf of class that holds records created now.
func currentLeaf(b *testing.B, pool *pgxpool.Pool, class string) string {
	var leaf string
	err := pool.QueryRow(context.Background(), `SELECT leaf FROM keyed_effects_claim_leaves()
		WHERE class = $1 AND lo <= now() AND now() < hi LIMIT 1`, class).Scan(&leaf)
	require.NoError(b, err, "find the current %s leaf", class)
	return leaf
}

// legacyLayoutSQL undoes migration 0009: the key in the database's default
// collation, the tenant, finished and kind/created indexes.
// BenchmarkEffectStorage compares it with the current layout.
const legacyLayoutSQL = `
ALTER TABLE keyed_effects ALTER COLUMN key TYPE text COLLATE "default";
DROP INDEX keyed_effects_created_idx;
CREATE INDEX keyed_effects_finished_idx ON keyed_effects (finished_at) WHERE state <> 'claimed';
CREATE INDEX keyed_effects_tenant_idx ON keyed_effects (tenant_id, key text_pattern_ops);
CREATE INDEX keyed_effects_kind_created_idx ON keyed_effects (kind, created_at);`

// BenchmarkEffectStorage loads the same records into the layout before
// migration 0009 and the current one, as the pipeline writes them (a batch
// of claims, then the same batch completed), and reports bytes per million
// records (table and indexes, as loaded and after VACUUM), the share of HOT
// completions, and how fast Prune deletes them. It ignores b.N: run it with
// -benchtime 1x. STORAGE_ROWS sets the record count (default 100000).
func BenchmarkEffectStorage(b *testing.B) {
	rows := 100_000
	if v := os.Getenv("STORAGE_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err, "STORAGE_ROWS")
		rows = n
	}
	for _, layout := range []string{"before", "after", "partitioned"} {
		b.Run("layout="+layout, func(b *testing.B) {
			pool := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: 4, Unpartitioned: layout != "partitioned"})
			ctx := context.Background()
			client := effectstest.NewClient(b, pool, &effects.ClientOpts{Logger: slog.New(slog.DiscardHandler)})
			switch layout {
			case "before":
				_, err := pool.Exec(ctx, legacyLayoutSQL)
				require.NoError(b, err)
			case "partitioned":
				_, err := client.EnsureLeaves(ctx, 41*24*time.Hour, 0)
				require.NoError(b, err)
			}
			loadEffects(b, pool, rows)
			perM := func(bytes int64) float64 { return float64(bytes) * 1e6 / float64(rows) / (1 << 20) }
			heap, idx := effectSizes(b, pool)
			b.ReportMetric(perM(heap+idx), "MiB/M_loaded")
			var hot, upd int64
			require.NoError(b, pool.QueryRow(ctx, effectTables+`SELECT coalesce(sum(n_tup_hot_upd), 0), coalesce(sum(n_tup_upd), 0)
				FROM pg_stat_user_tables WHERE relid IN (SELECT relid FROM effect_tables)`).Scan(&hot, &upd))
			if upd > 0 {
				b.ReportMetric(float64(hot)/float64(upd), "hot_share")
			}
			_, err := pool.Exec(ctx, `VACUUM ANALYZE keyed_effects`)
			require.NoError(b, err)
			heap, idx = effectSizes(b, pool)
			b.ReportMetric(perM(heap), "heap_MiB/M")
			b.ReportMetric(perM(idx), "index_MiB/M")
			b.ReportMetric(perM(heap+idx), "MiB/M")

			start := time.Now()
			if layout == "partitioned" {
				require.NoError(b, client.SetLifetimes(ctx, []effects.Lifetime{{Kind: "", Keep: 24 * time.Hour}}, nil))
				_, err := client.Retire(ctx, nil)
				require.NoError(b, err)
				var left int64
				require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_effects`).Scan(&left))
				require.Zero(b, left, "every loaded record is past its lifetime")
				b.ReportMetric(float64(rows)/time.Since(start).Seconds(), "pruned/s")
				return
			}
			n, err := client.Prune(ctx, &effects.PruneOpts{Retention: effects.DefaultRetention})
			require.NoError(b, err)
			require.EqualValues(b, rows, n, "every loaded record is past the retention")
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "pruned/s")
		})
	}
}

// loadEffects writes rows finished records, 40 days old, in batches of 5:
// the batch's claims (the claim INSERT's columns), then the batch completed
// (the Complete UPDATE's columns), so that completions find their rows in
// the page still being filled, as they do in the pipeline, where a step
// completes its claim milliseconds after making it.
func loadEffects(b *testing.B, pool *pgxpool.Pool, rows int) {
	ctx := context.Background()
	const batch = 5
	kinds := []string{"charge", "mark_paid", "receipt"}
	for from := 0; from < rows; from += batch {
		var keys, tenants, ks, owners []string
		var ages []int64
		for g := from; g < min(from+batch, rows); g++ {
			tenant, id, kind := fmt.Sprintf("tenant%d", g%50), fmt.Sprintf("%032x", uint64(g)*0x9e3779b97f4a7c15), kinds[g%3]
			keys = append(keys, tenant+":order:"+id+":"+kind)
			tenants, ks = append(tenants, tenant), append(ks, kind)
			owners = append(owners, "checkout:"+tenant+":"+id+"/"+kind)
			ages = append(ages, int64(rows-g))
		}
		_, err := pool.Exec(ctx, `
INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, fingerprint, lease_until, created_at)
SELECT k, t, kind, 'claimed', o, 'sha256:' || left(md5(k), 32), now() + interval '5 minutes',
       now() - interval '40 days' - age * interval '1 millisecond'
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[]) AS u(k, t, kind, o, age)`,
			keys, tenants, ks, owners, ages)
		require.NoError(b, err)
		_, err = pool.Exec(ctx, `
UPDATE keyed_effects
SET state = 'succeeded', result = '{"amount":500,"id":"pi_3PqRsTuVwXyZ123456789012"}', lease_until = NULL,
    finished_at = created_at + interval '1 second', updated_at = now()
WHERE key = ANY($1)`, keys)
		require.NoError(b, err)
	}
}

// effectSizes returns keyed_effects' heap (with TOAST) and index sizes,
// summed over its partitions.
// effectTables names keyed_effects and, when it is partitioned, every
// table of its tree (pg_partition_tree lists nothing for a plain table).
const effectTables = `WITH effect_tables AS (
	SELECT relid FROM pg_partition_tree('keyed_effects') UNION SELECT 'keyed_effects'::regclass)
`

func effectSizes(b *testing.B, pool *pgxpool.Pool) (heap, idx int64) {
	err := pool.QueryRow(context.Background(), effectTables+`SELECT coalesce(sum(pg_table_size(relid)), 0)::bigint,
		coalesce(sum(pg_indexes_size(relid)), 0)::bigint FROM effect_tables`).
		Scan(&heap, &idx)
	require.NoError(b, err)
	return heap, idx
}

// BenchmarkRetire retires RETIRE_ROWS expired records (default 1 000 000;
// make bench-retire sets 10 000 000) two ways, side by side: Prune's
// batched DELETE on the unpartitioned table and Retire's drop of whole
// leaves. For each it reports the time the retirement took, its WAL bytes
// (the WAL written meanwhile less what the claims alone write at the same
// rate), and the p99 of claim+complete at 8 connections while it runs and
// idle, afterwards, for as long. It ignores b.N: run it with -benchtime 1x.
func BenchmarkRetire(b *testing.B) {
	rows := 1_000_000
	if v := os.Getenv("RETIRE_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err, "RETIRE_ROWS")
		rows = n
	}
	for _, layout := range []string{"delete", "drop"} {
		b.Run("retire="+layout, func(b *testing.B) {
			ctx := context.Background()
			pool := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: 12, Unpartitioned: layout == "delete"})
			client := benchClient(b, pool)
			retire := func() error {
				_, err := client.Prune(ctx, &effects.PruneOpts{Retention: 24 * time.Hour, BatchSize: 5000})
				return err
			}
			if layout == "drop" {
				require.NoError(b, client.SetLifetimes(ctx, []effects.Lifetime{{Kind: "", Keep: 24 * time.Hour}}, nil))
				_, err := client.EnsureLeaves(ctx, 41*24*time.Hour, 0)
				require.NoError(b, err)
			}
			bulkLoadExpired(b, pool, rows)
			if layout == "drop" {
				dropEmptyLeaves(b, pool)
			}
			// The load's dirty pages are written out first, so that the
			// checkpoint's I/O is in neither the idle nor the retirement p99.
			_, err := pool.Exec(ctx, `CHECKPOINT`)
			require.NoError(b, err)
			var dropTook time.Duration
			var dropFrom time.Time
			if layout == "drop" {
				retire = func() error {
					res, err := client.Retire(ctx, nil)
					if err == nil {
						dropTook, dropFrom = res.DropTook, time.Now().Add(-res.DropTook)
					}
					return err
				}
			}
			// Each session plans the claim function at its first claim:
			// the sessions are warmed before anything is timed.
			claimLatencies(b, client, pool, sleeping(2*time.Second))
			during, wal, took := claimLatencies(b, client, pool, retire)
			// Idle is timed afterwards over as long a window (10 s at
			// least): the longer a window, the likelier it holds an
			// autovacuum or a checkpoint, which raise its p99 with or
			// without a retirement.
			idle, idleWAL, idleTook := claimLatencies(b, client, pool, sleeping(max(took, 10*time.Second)))
			if layout == "drop" {
				// The DROP and its commit were the last thing Retire did: a
				// claim that ended after it began is counted in its window.
				var inDrop, rest []sample
				for _, s := range during {
					if s.at.Add(s.d).After(dropFrom) {
						inDrop = append(inDrop, s)
					} else {
						rest = append(rest, s)
					}
				}
				b.ReportMetric(dropTook.Seconds(), "drop_s")
				b.ReportMetric(float64(p99(inDrop).Microseconds())/1000, "drop_p99_ms")
				b.ReportMetric(float64(p99(rest).Microseconds())/1000, "check_p99_ms")
			}
			walRate := float64(idleWAL) / idleTook.Seconds()
			b.ReportMetric(took.Seconds(), "retire_s")
			b.ReportMetric(max(float64(wal)-walRate*took.Seconds(), 0)/(1<<20), "retire_WAL_MiB")
			b.ReportMetric(float64(p99(idle).Microseconds())/1000, "idle_p99_ms")
			b.ReportMetric(float64(p99(during).Microseconds())/1000, "during_p99_ms")
			b.ReportMetric(float64(p99(during))/float64(p99(idle)), "p99_during/idle")
			var left int64
			require.NoError(b, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_effects WHERE kind = 'receipt'`).Scan(&left))
			require.Zero(b, left, "every expired record is gone")
		})
	}
}

// bulkLoadExpired writes rows finished receipt records, 40 days old, in a
// few large statements, and vacuums them.
func bulkLoadExpired(b *testing.B, pool *pgxpool.Pool, rows int) {
	const batch = 200_000
	for from := 0; from < rows; from += batch {
		_, err := pool.Exec(context.Background(), `
INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, fingerprint, result, created_at, finished_at)
SELECT 'tenant' || g % 50 || ':order:' || md5(g::text) || ':receipt', 'tenant' || g % 50, 'receipt', 'succeeded',
	'checkout:' || md5(g::text) || '/receipt', 'sha256:' || left(md5(g::text), 32), '{"message_id":"sg_0123456789abcdef"}',
	now() - interval '40 days' + g * interval '1 millisecond', now() - interval '40 days' + g * interval '1 millisecond'
FROM generate_series($1::bigint, $2::bigint) g`, from, min(from+batch, rows)-1)
		require.NoError(b, err)
	}
	// Records a month old have long been vacuumed by autovacuum: their
	// hint bits set, their pages all-visible. A fresh load has neither,
	// and autovacuum would work through it while the claims are timed.
	_, err := pool.Exec(context.Background(), `VACUUM (ANALYZE) keyed_effects`)
	require.NoError(b, err)
}

// dropEmptyLeaves drops the empty leaves older than a day: a running
// deployment retired them long ago, and a claim looks in every leaf of its
// class.
func dropEmptyLeaves(b *testing.B, pool *pgxpool.Pool) {
	_, err := pool.Exec(context.Background(), `DO $$
DECLARE l record;
BEGIN
    FOR l IN SELECT x.leaf, x.lo, x.hi FROM keyed_effects_leaf_bounds('keyed_effects_default') x WHERE x.hi < now() - interval '1 day' LOOP
        IF NOT EXISTS (SELECT FROM keyed_effects_default WHERE created_at >= l.lo AND created_at < l.hi) THEN
            EXECUTE format('DROP TABLE %I', l.leaf);
        END IF;
    END LOOP;
END $$`)
	require.NoError(b, err)
}

// claimLatencies runs claim+complete of fresh charge keys at 8 connections
// for as long as work runs, and returns each pair's latency, the WAL bytes
// written meanwhile and how long work took.
func claimLatencies(b *testing.B, c *effects.Client, pool *pgxpool.Pool, work func() error) ([]sample, int64, time.Duration) {
	ctx := context.Background()
	var before string
	require.NoError(b, pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&before))
	stop := make(chan struct{})
	var mu sync.Mutex
	var lat []sample
	var wg sync.WaitGroup
	var seq atomic.Int64
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				t := time.Now()
				key := effects.MustKey("live", "order", fmt.Sprintf("%d-%d", time.Now().UnixNano(), seq.Add(1)), "charge")
				cl, err := c.Claim(ctx, effects.ClaimParams{Key: key, Owner: "bench"})
				if err == nil {
					err = c.Complete(ctx, cl, map[string]any{"id": "pi_123"})
				}
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				lat = append(lat, sample{at: t, d: time.Since(t)})
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	err := work()
	took := time.Since(start)
	close(stop)
	wg.Wait()
	require.NoError(b, err)
	var wal int64
	require.NoError(b, pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint`, before).Scan(&wal))
	return lat, wal, took
}

// sleeping is work for claimLatencies that does nothing for d.
func sleeping(d time.Duration) func() error {
	return func() error { time.Sleep(d); return nil }
}

// sample is one claim+complete: when it began and how long it took.
type sample struct {
	at time.Time
	d  time.Duration
}

func p99(samples []sample) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	d := make([]time.Duration, len(samples))
	for i, s := range samples {
		d[i] = s.d
	}
	slices.Sort(d)
	return d[len(d)*99/100]
}

// BenchmarkGetMiss prices Get's look-up of a key with no record (an
// answer that shows a step not claimed yet) on the leaves a worker makes,
// one connection: the classes of the key's kind, then the other classes,
// as Get does now, beside the classes of the key's kind, then every leaf,
// as it did before. Both read Get's columns, alternating per key. It
// reports µs per look-up of each and their ratio.
func BenchmarkGetMiss(b *testing.B) {
	ctx := context.Background()
	pool := effectstest.NewPool(b, &effectstest.PoolOpts{MaxConns: 1})
	benchLeaves(b, pool, benchClient(b, pool), nil)
	const classes = `'charge', 'default', 'legacy'`
	lookUp := func(key string, conds ...string) error {
		for _, cond := range conds {
			rows, err := pool.Query(ctx, `SELECT `+effects.RecordColumns+` FROM keyed_effects WHERE key = $1`+cond, key)
			if err != nil {
				return err
			}
			found := rows.Next()
			rows.Close()
			if err := rows.Err(); err != nil || found {
				return fmt.Errorf("look-up of %s: found %v, %v", key, found, err)
			}
		}
		return nil
	}
	sides := [][]string{
		{" AND class IN (" + classes + ")", " AND class NOT IN (" + classes + ")"},
		{" AND class IN (" + classes + ")", ""},
	}
	var took [2]time.Duration
	b.ResetTimer()
	for i := range b.N {
		key := effects.MustKey("acme", "order", fmt.Sprint("none", i), "charge").String()
		for k := range sides {
			j := (i + k) % 2
			start := time.Now()
			if err := lookUp(key, sides[j]...); err != nil {
				b.Fatal(err)
			}
			took[j] += time.Since(start)
		}
	}
	b.StopTimer()
	us := func(j int) float64 { return float64(took[j].Microseconds()) / float64(b.N) }
	b.ReportMetric(us(0), "get_µs")
	b.ReportMetric(us(1), "before_µs")
	b.ReportMetric(us(0)/us(1), "ratio")
}
