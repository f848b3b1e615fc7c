package outbox_test

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/outbox"
)

var (
	benchFlood   = flag.Int("relay.flood", 10_000, "orders tenant A commits in BenchmarkRelayFairness before B's")
	benchVictims = flag.Int("relay.victims", 50, "orders tenant B commits in BenchmarkRelayFairness, at 10 a second")
)

// BenchmarkRelayFairness measures what tenant A's flood costs tenant B.
// With a relay running (woken by Listen, default options, the production
// starter on the shared dev server), A commits -relay.flood orders, 100 per
// transaction, as fast as Postgres takes them; then B commits
// -relay.victims orders, one per transaction, ten a second. It reports B's
// latency from each commit's return to its start's return (p50-ms, p99-ms,
// max-ms), A's unsent rows when B's first order committed (a-backlog), and
// how long the relay took to start every order, counted from its start
// (drain-s), and its starts per second over that time (starts/s): the same
// work for the FIFO claim the relay had before (claim=fifo) as for the fair
// claim (claim=fair), side by side in one run. Run it with `make
// bench-fair`.
func BenchmarkRelayFairness(b *testing.B) {
	for _, claim := range []string{"fifo", "fair"} {
		b.Run("claim="+claim, func(b *testing.B) {
			for range b.N {
				fairnessLoad(b, claim == "fifo")
			}
		})
	}
}

func fairnessLoad(b *testing.B, fifo bool) {
	var tune func(*outbox.Relay)
	if fifo {
		tune = (*outbox.Relay).UseFIFOClaimForTest
	}
	rig := startRelayRig(b, 8, &outbox.RelayOpts{}, tune)
	began := time.Now()
	tenantA, tenantB := "flood"+randomID(4), "quiet"+randomID(4)
	for i := 0; i < *benchFlood; i += 100 {
		_, err := rig.commit(tenantA, i, min(100, *benchFlood-i))
		require.NoError(b, err)
	}
	var backlog int
	require.NoError(b, rig.pool.QueryRow(rig.ctx, `SELECT count(*) FROM keyed_outbox WHERE sent_at IS NULL`).Scan(&backlog))

	committed := offer(b, 10, *benchVictims, func(i int) (string, error) { return rig.commit(tenantB, i, 1) })
	total := *benchFlood + len(committed)
	require.Eventually(b, func() bool { return rig.starter.count() >= total }, 30*time.Minute, 10*time.Millisecond,
		"every order is started")
	elapsed := time.Since(began)
	rig.stop()
	b.ReportMetric(float64(backlog), "a-backlog")
	b.ReportMetric(elapsed.Seconds(), "drain-s")
	b.ReportMetric(float64(total)/elapsed.Seconds(), "starts/s")
	reportLatencies(b, rig.starter.since(committed))
}
