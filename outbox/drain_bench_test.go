package outbox_test

import (
	"context"
	"flag"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/proccpu"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

var (
	drainRows  = flag.Int("relay.drain", 2000, "the backlog BenchmarkRelayDrain drains")
	drainStart = flag.Duration("relay.start", 2*time.Millisecond, "how long each start takes in BenchmarkRelayDrain")
)

// BenchmarkRelayDrain drains a backlog of -relay.drain rows (default 2000)
// through Run, with the default concurrency and a starter that takes
// -relay.start (default 2 ms) and starts nothing, so that what is priced is
// the relay's own work: marking the started rows with its next claim
// ("claims", as shipped) beside marking each row as its start returns and
// claiming at every free slot ("each", the relay before), in alternating
// order, each on a schema of its own. It reports for each side rows/s, the
// relay's claims and marks per row, and the CPU per row of this process and
// of every Postgres process (the last round's, with -benchtime above 1x).
// Run it with -benchtime 1x -count 3 on an otherwise idle machine.
func BenchmarkRelayDrain(b *testing.B) {
	for range b.N {
		// Alternate which side goes first, round by round.
		sides := []bool{false, true}
		if drainRounds.Add(1)%2 == 0 {
			sides = []bool{true, false}
		}
		for _, markEach := range sides {
			drain(b, markEach)
		}
	}
}

// drainRounds counts BenchmarkRelayDrain's rounds across -count.
var drainRounds atomic.Int32

// drain commits the backlog (untimed), times a relay draining it and
// reports the figures under the side's name.
func drain(b *testing.B, markEach bool) {
	b.StopTimer()
	defer b.StartTimer()
	_, url := effectstest.NewSchema(b)
	pool := dbtest.Connect(b, url, &effectstest.PoolOpts{MaxConns: 8})
	commitBacklog(b, pool, *drainRows)
	db := &countingDB{DB: pool}
	var started atomic.Int64
	all := make(chan struct{})
	starter := outbox.StarterFunc(func(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
		time.Sleep(*drainStart)
		if started.Add(1) == int64(*drainRows) {
			close(all)
		}
		return &outbox.Started{WorkflowID: req.WorkflowID, RunID: "run-" + req.WorkflowID, Created: true}, nil
	})
	r, err := outbox.NewRelay(db, starter, &outbox.RelayOpts{Logger: quietSlog(), PruneInterval: -1})
	require.NoError(b, err)
	side := "claims"
	if markEach {
		r.MarkEachRowForTest()
		side = "each"
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	self, pg, began := proccpu.Of("self"), proccpu.Postgres(), time.Now()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-all
	cancel() // Run marks what it started before it returns.
	require.NoError(b, <-done)
	elapsed, selfCPU, pgCPU := time.Since(began), proccpu.Of("self")-self, proccpu.Postgres()-pg
	var unsent int
	require.NoError(b, pool.QueryRow(context.Background(), `SELECT count(*) FROM keyed_outbox WHERE sent_at IS NULL`).Scan(&unsent))
	require.Zero(b, unsent, "every started row is marked")
	n := float64(*drainRows)
	b.ReportMetric(n/elapsed.Seconds(), side+"-rows/s")
	b.ReportMetric(float64(db.claims.Load()+db.marks.Load())/n, side+"-stmts/row")
	b.ReportMetric(float64(selfCPU.Microseconds())/n, side+"-self-cpu-µs/row")
	b.ReportMetric(float64(pgCPU.Microseconds())/n, side+"-pg-cpu-µs/row")
}

// commitBacklog commits n orders with their outbox rows, 100 to a
// transaction.
func commitBacklog(b *testing.B, pool *pgxpool.Pool, n int) {
	store, err := orders.NewStore(pool)
	require.NoError(b, err)
	tenant := "drain" + randomID(4)
	for first := 0; first < n; first += 100 {
		err := commitOrders(context.Background(), pool, store, tenant, first, min(100, n-first))
		require.NoError(b, err)
	}
}
