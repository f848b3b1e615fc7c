package outbox

import (
	"context"
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

// fifoClaimSQL is the claim before the fair one: the oldest due rows
// first, whatever their tenant. It reports every row in round 0, so that
// claim keeps the batch in id order, as it did.
var fifoClaimSQL = `
UPDATE keyed_outbox o
SET available_at = now() + $2 * interval '1 microsecond', attempts = o.attempts + 1, claimed_by = $3
FROM (
	SELECT id FROM keyed_outbox
	WHERE sent_at IS NULL AND available_at <= now()
	ORDER BY available_at, id
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) due
WHERE o.id = due.id
RETURNING ` + strings.Replace(claimColumns, "o.fair_round", "0::bigint", 1)

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
