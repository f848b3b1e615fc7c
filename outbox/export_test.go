package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ClaimAndDie claims one batch the way Poll does and then stops, as a relay
// killed right after its claim would.
func (r *Relay) ClaimAndDie(ctx context.Context) (int, error) {
	rows, err := r.db.Query(ctx, r.claimSQL, r.batch, r.lease.Microseconds(), r.name+"/dead")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
	}
	return n, rows.Err()
}

// fifoClaimSQL is the claim before the fair one: claimSQL taking the
// oldest due rows first, whatever their tenant. It reports every row in
// round 0, so that claim keeps the batch in id order, as it did.
var fifoClaimSQL = mustReplace(mustReplace(claimSQL,
	"ORDER BY fair_round, available_at, id", "ORDER BY available_at, id"),
	"o.fair_round,", "0::bigint,")

// mustReplace replaces the one old in s with new, and panics when s does
// not hold old exactly once.
func mustReplace(s, old, new string) string {
	if strings.Count(s, old) != 1 {
		panic(fmt.Sprintf("outbox: %q is not in the claim once", old))
	}
	return strings.Replace(s, old, new, 1)
}

// UseFIFOClaimForTest makes the relay claim the oldest due rows first,
// whatever their tenant, as it did before the fair claim: the baseline of
// the fairness test and benchmark.
func (r *Relay) UseFIFOClaimForTest() { r.claimSQL = fifoClaimSQL }

// Backoff exposes the relay's jittered backoff.
func (r *Relay) Backoff(n int) time.Duration { return r.backoff(n) }

// FailuresForTest, DepthForTest and StartsForTest expose collectors for
// testutil.ToFloat64.
func (m *Metrics) FailuresForTest() prometheus.Collector { return m.failures }

func (m *Metrics) DepthForTest() prometheus.Collector { return m.depth }

func (m *Metrics) StartsForTest(result string) prometheus.Collector {
	return m.starts.WithLabelValues(result)
}

// NotifyEveryEnqueueForTest makes every enqueue notify, as each did before
// NotifyWindow, and returns a function that restores the window: the
// baseline of BenchmarkEnqueue. Parallel tests meanwhile notify on every
// enqueue too, which they are written to allow.
func NotifyEveryEnqueueForTest() (restore func()) {
	wakes.window.Store(0)
	return func() { wakes.window.Store(int64(NotifyWindow)) }
}

// MarkEachRowForTest makes Run mark each row as its start returns and
// claim again as soon as one slot is free, as it did before it marked with
// its claims: the baseline of TestRunMarksStartedRowsWithItsNextClaim and
// BenchmarkRelayDrain.
func (r *Relay) MarkEachRowForTest() { r.markEach = true }
