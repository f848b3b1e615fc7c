package outbox

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ClaimAndDie claims one batch the way Poll does and then stops, as a relay
// killed right after its claim would.
func (r *Relay) ClaimAndDie(ctx context.Context) (int, error) {
	rows, err := r.db.Query(ctx, claimSQL, r.batch, r.lease.Microseconds(), r.name+"/dead")
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

// Backoff exposes the relay's jittered backoff.
func (r *Relay) Backoff(n int) time.Duration { return r.backoff(n) }

// FailuresForTest, DepthForTest and StartsForTest expose collectors for
// testutil.ToFloat64.
func (m *Metrics) FailuresForTest() prometheus.Collector { return m.failures }

func (m *Metrics) DepthForTest() prometheus.Collector { return m.depth }

func (m *Metrics) StartsForTest(result string) prometheus.Collector {
	return m.starts.WithLabelValues(result)
}
