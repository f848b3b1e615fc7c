package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

func TestRelayStartsEachCommittedOrderOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.createOrders(t, 5)
	r := b.relay(t, nil)
	n, err := r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Zero(t, b.unsent(t))
	require.Equal(t, 5, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE run_id <> '' AND claimed_by IS NULL`))
	b.requireOneRunEach(t, ids)

	// Nothing is due any more.
	n, err = r.Poll(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	calls, created := b.starter.counts()
	require.Len(t, calls, 5)
	for _, id := range ids {
		require.Equal(t, 1, calls[orders.WorkflowID(b.tenant, id)])
		require.Equal(t, 1, created[orders.WorkflowID(b.tenant, id)])
	}
}

// A Temporal error: the row goes back with a jittered backoff, the relay
// reports the error, and the next poll after the backoff starts it.
func TestRelayBacksOffWhenStartsFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createOrders(t, 3)
	b.starter.setFail(func(outbox.Request) error { return errors.New("temporal: unavailable") })
	reg := prometheus.NewRegistry()
	metrics, err := outbox.NewMetrics(reg)
	require.NoError(t, err)
	r := b.relay(t, &outbox.RelayOpts{Concurrency: 1, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Metrics: metrics})

	n, err := r.Poll(b.ctx)
	require.ErrorContains(t, err, "temporal: unavailable")
	require.Zero(t, n)
	calls, _ := b.starter.counts()
	require.Len(t, calls, 1, "the first failure stops the batch instead of hammering Temporal (one start at a time here)")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE last_error LIKE '%unavailable%' AND attempts = 1`))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE attempts = 0 AND claimed_by IS NULL`),
		"the rest of the batch is given back unclaimed")
	require.Equal(t, 1.0, testutil.ToFloat64(metrics.FailuresForTest()))

	b.starter.setFail(nil)
	require.Eventually(t, func() bool {
		_, err := r.Poll(b.ctx)
		return err == nil && b.unsent(t) == 0
	}, 5*time.Second, 20*time.Millisecond)
	_, created := b.starter.counts()
	require.Len(t, created, 3)
}

// A crash between the order commit and the workflow start, three ways: no
// relay running at commit time, a relay killed right after claiming, and a
// start that reached Temporal but was never marked sent. Each ends with the
// workflow started exactly once.
func TestCrashBetweenCommitAndStartStillStartsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.createOrders(t, 4)

	// A relay claims everything and dies holding it.
	dead := b.relay(t, &outbox.RelayOpts{Name: "dead", Lease: 2 * time.Second, StartTimeout: time.Second})
	n, err := dead.ClaimAndDie(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n)

	// The live relay's first start reaches Temporal, then the reply is lost.
	var once sync.Once
	lossy := wrapAfter(b.starter, func(outbox.Request) error {
		var err error
		once.Do(func() { err = errors.New("connection reset after the start was sent") })
		return err
	})
	live, err := outbox.NewRelay(b.pool, lossy, &outbox.RelayOpts{Name: "live", Lease: 2 * time.Second,
		StartTimeout: time.Second, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: b.logger})
	require.NoError(t, err)
	n, err = live.Poll(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "rows under a live lease belong to the relay holding them")

	require.Eventually(t, func() bool {
		_, _ = live.Poll(b.ctx)
		return b.unsent(t) == 0
	}, 10*time.Second, 50*time.Millisecond, "the lease runs out and the live relay starts every row")

	b.requireOneRunEach(t, ids)
	calls, created := b.starter.counts()
	total := 0
	for _, id := range ids {
		require.Equal(t, 1, created[orders.WorkflowID(b.tenant, id)], "one run for %s", id)
		total += calls[orders.WorkflowID(b.tenant, id)]
	}
	require.Equal(t, 5, total, "four starts plus one repeat that collapsed")
}

// wrapAfter calls next and then after, returning after's error if any: the
// start happened, the caller is told it failed.
func wrapAfter(next outbox.Starter, after func(outbox.Request) error) outbox.Starter {
	return outbox.StarterFunc(func(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
		st, err := next.Start(ctx, req)
		if err != nil {
			return nil, err
		}
		if err := after(req); err != nil {
			return nil, err
		}
		return st, nil
	})
}

// Two relays race over 500 committed rows. Every workflow is started exactly
// once: counted at the starter, and counted in Temporal.
func TestTwoRelaysRacingStartEachWorkflowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.createOrders(t, 500)
	reg := prometheus.NewRegistry()
	metrics, err := outbox.NewMetrics(reg)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	var perRelay [2]atomic.Int64
	for i, name := range []string{"relay-a", "relay-b"} {
		counted := outbox.StarterFunc(func(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
			perRelay[i].Add(1)
			return b.starter.Start(ctx, req)
		})
		r, err := outbox.NewRelay(b.pool, counted, &outbox.RelayOpts{Name: name, BatchSize: 25,
			PollInterval: 10 * time.Millisecond, StatsInterval: 50 * time.Millisecond, Metrics: metrics, Logger: b.logger})
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, r.Run(ctx))
		}()
	}
	require.Eventually(t, func() bool { return b.unsent(t) == 0 }, 60*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return testutil.ToFloat64(metrics.DepthForTest()) == 0 }, 5*time.Second, 20*time.Millisecond)
	cancel()
	wg.Wait()

	calls, created := b.starter.counts()
	require.Len(t, calls, 500)
	for _, id := range ids {
		wf := orders.WorkflowID(b.tenant, id)
		require.Equal(t, 1, calls[wf], "start calls for %s", wf)
		require.Equal(t, 1, created[wf], "runs created for %s", wf)
	}
	require.Positive(t, perRelay[0].Load(), "relay-a did part of the work")
	require.Positive(t, perRelay[1].Load(), "relay-b did part of the work")
	require.EqualValues(t, 500, perRelay[0].Load()+perRelay[1].Load())
	require.Zero(t, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE claimed_by IS NOT NULL OR run_id IS NULL`))
	require.Equal(t, 500.0, testutil.ToFloat64(metrics.StartsForTest("started")))
	b.requireOneRunEach(t, ids)
}

func TestRelayStartStopForFx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	metrics, err := outbox.NewMetrics(reg)
	require.NoError(t, err)
	r := b.relay(t, &outbox.RelayOpts{PollInterval: 10 * time.Millisecond, StatsInterval: 10 * time.Millisecond, Metrics: metrics})

	startCtx, cancel := context.WithCancel(b.ctx)
	require.NoError(t, r.Start(startCtx))
	cancel() // fx cancels the start context once OnStart returns; the relay must keep running
	require.ErrorIs(t, r.Start(b.ctx), outbox.ErrRunning)
	require.ErrorIs(t, r.Run(b.ctx), outbox.ErrRunning)

	ids := b.createOrders(t, 3)
	require.Eventually(t, func() bool { return b.unsent(t) == 0 }, 10*time.Second, 20*time.Millisecond)
	b.requireOneRunEach(t, ids)

	stopCtx, stopCancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer stopCancel()
	require.NoError(t, r.Stop(stopCtx))
	require.NoError(t, r.Stop(stopCtx), "a second stop is a no-op")

	// Stopped: new rows wait, and the gauges say so once a relay runs again.
	b.createOrdersWithPrefix(t, "late", 2)
	time.Sleep(50 * time.Millisecond)
	require.Equal(t, 2, b.unsent(t))
	require.NoError(t, r.Start(b.ctx))
	// 30s: under a loaded CI a start may fail once and back off.
	require.Eventually(t, func() bool { return b.unsent(t) == 0 }, 30*time.Second, 20*time.Millisecond)
	stopCtx, stopCancel = context.WithTimeout(b.ctx, 5*time.Second) // the first may have run out meanwhile
	defer stopCancel()
	require.NoError(t, r.Stop(stopCtx))
	require.Equal(t, 5.0, testutil.ToFloat64(metrics.StartsForTest("started")))
}

// Stopping mid-batch gives the unstarted rows back at once instead of
// leaving them to the lease.
func TestRelayStopGivesBackUnstartedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createOrders(t, 10)
	started := make(chan struct{})
	var once sync.Once
	b.starter.setFail(func(req outbox.Request) error {
		if strings.HasSuffix(orderOf(req), "0003") {
			once.Do(func() { close(started) })
			time.Sleep(200 * time.Millisecond)
		}
		return nil
	})
	r := b.relay(t, &outbox.RelayOpts{PollInterval: time.Hour, Concurrency: 1, BatchSize: 10})
	require.NoError(t, r.Start(b.ctx))
	<-started
	stopCtx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(stopCtx))
	unsent := b.unsent(t)
	require.Positive(t, unsent)
	require.Equal(t, unsent, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE sent_at IS NULL AND claimed_by IS NULL AND available_at <= now()`),
		"every unsent row is claimable right away")
}

func TestBackoffIsFullJitterWithinBounds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.relay(t, &outbox.RelayOpts{MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second})
	for n := 1; n <= 40; n++ {
		ceiling := min(time.Second, 100*time.Millisecond<<(min(n, 20)-1))
		var sawLow, sawHigh bool
		for range 200 {
			d := r.Backoff(n)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, ceiling, "attempt %d", n)
			sawLow = sawLow || d < ceiling/2
			sawHigh = sawHigh || d >= ceiling/2
		}
		require.True(t, sawLow && sawHigh, "attempt %d: delays spread over [0, %s]", n, ceiling)
	}
}

// Each row's result is recorded with a budget of its own, counted from the
// end of its own start: two slow starts make the poll last longer than the
// record budget, yet every row, slow or fast, is marked sent, and the fast
// ones are marked while the slow ones are still starting.
func TestRelayRecordsEachRowWithItsOwnBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.createOrders(t, 8)
	const budget = time.Second
	var sentWhileSlow []int
	var mu sync.Mutex
	b.starter.setFail(func(req outbox.Request) error {
		if strings.HasSuffix(orderOf(req), "0001") || strings.HasSuffix(orderOf(req), "0005") {
			time.Sleep(2 * budget)
			mu.Lock()
			sentWhileSlow = append(sentWhileSlow, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE sent_at IS NOT NULL`))
			mu.Unlock()
		}
		return nil
	})
	r := b.relay(t, &outbox.RelayOpts{Concurrency: 8, RecordTimeout: budget, StartTimeout: 5 * time.Second, Lease: 10 * time.Second})
	began := time.Now()
	n, err := r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Greater(t, time.Since(began), budget, "the poll outlasted one record budget")
	require.Zero(t, b.unsent(t))
	// Each slow start saw the six fast rows marked (and perhaps the other
	// slow row, when it finished first).
	require.Len(t, sentWhileSlow, 2)
	for _, sent := range sentWhileSlow {
		require.GreaterOrEqual(t, sent, 6, "the fast rows were marked while the slow ones started: %v", sentWhileSlow)
	}
	b.requireOneRunEach(t, ids)
}

// failingDB fails the statements that contain match while fail is set.
type failingDB struct {
	effects.DB
	match string
	fail  atomic.Int32 // how many more matching statements fail
}

// fails reports whether sql is to fail, counting it.
func (d *failingDB) fails(sql string) bool {
	return strings.Contains(sql, d.match) && d.fail.Add(-1) >= 0
}

func (d *failingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if d.fails(sql) {
		return pgconn.CommandTag{}, errors.New("connection reset by peer")
	}
	return d.DB.Exec(ctx, sql, args...)
}

func (d *failingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if d.fails(sql) {
		return nil, errors.New("connection reset by peer")
	}
	return d.DB.Query(ctx, sql, args...)
}

// A row whose workflow started but whose mark failed is marked by the very
// next pass, long before its lease runs out, without a second start.
func TestRelayMarksAStartedButUnmarkedRowOnTheNextPass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.createOrders(t, 3)
	db := &failingDB{DB: b.pool, match: "SET sent_at"}
	db.fail.Store(1)
	r, err := outbox.NewRelay(db, b.starter, &outbox.RelayOpts{Concurrency: 1, Logger: b.logger})
	require.NoError(t, err)

	n, err := r.Poll(b.ctx)
	require.ErrorContains(t, err, "connection reset by peer")
	require.Equal(t, 2, n, "the other rows were marked")
	require.Equal(t, 1, b.unsent(t))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE sent_at IS NULL AND available_at > now() + interval '20 seconds'`),
		"the unmarked row is under its 30-second lease")

	n, err = r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, b.unsent(t))
	require.Zero(t, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE run_id IS NULL OR claimed_by IS NOT NULL`))
	calls, _ := b.starter.counts()
	for _, id := range ids {
		require.Equal(t, 1, calls[orders.WorkflowID(b.tenant, id)], "one start for %s", id)
	}
	b.requireOneRunEach(t, ids)
}

// Neither Poll nor Run has more starts in flight than Concurrency, and both
// reach it.
func TestRelayRespectsItsConcurrencyBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var inflight, peak atomic.Int32
	b.starter.setFail(func(outbox.Request) error {
		now := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			p := peak.Load()
			if now <= p || peak.CompareAndSwap(p, now) {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
		return nil
	})
	ids := b.createOrders(t, 20)
	r := b.relay(t, &outbox.RelayOpts{Concurrency: 4, PollInterval: 10 * time.Millisecond})
	n, err := r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 20, n)
	require.EqualValues(t, 4, peak.Load(), "Poll")

	peak.Store(0)
	ids = append(ids, b.createOrdersWithPrefix(t, "run", 20)...)
	b.runUntilSent(t, r)
	require.EqualValues(t, 4, peak.Load(), "Run")
	b.requireOneRunEach(t, ids)
}

// Under Run, a failed start makes the relay back off instead of claiming
// more, and the row comes back after its own jittered backoff.
func TestRunBacksOffAfterAFailedStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var failed atomic.Bool
	b.starter.setFail(func(outbox.Request) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("temporal: unavailable")
		}
		return nil
	})
	ids := b.createOrders(t, 5)
	r := b.relay(t, &outbox.RelayOpts{Concurrency: 1, PollInterval: 10 * time.Millisecond,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	b.runUntilSent(t, r)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE attempts = 2`), "the failed row was retried once")
	b.requireOneRunEach(t, ids)
}

// countingDB counts the relay's claims and marks.
type countingDB struct {
	effects.DB
	claims, marks atomic.Int32
}

func (d *countingDB) count(sql string) {
	switch {
	case strings.Contains(sql, "claimed_by = $3"):
		d.claims.Add(1)
	case strings.Contains(sql, "SET sent_at"):
		d.marks.Add(1)
	}
}

func (d *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	d.count(sql)
	return d.DB.Exec(ctx, sql, args...)
}

func (d *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.count(sql)
	return d.DB.Query(ctx, sql, args...)
}

// drainWithRun runs a relay of conc slots over db until no row is unsent.
func (b *bundle) drainWithRun(t *testing.T, db effects.DB, conc int, tune func(*outbox.Relay)) {
	t.Helper()
	r, err := outbox.NewRelay(db, b.starter, &outbox.RelayOpts{Concurrency: conc, PollInterval: 10 * time.Millisecond, Logger: b.logger})
	require.NoError(t, err)
	if tune != nil {
		tune(r)
	}
	b.runUntilSent(t, r)
}

// Run marks the rows it started with its next claim, which it makes once a
// quarter of its slots are free: a backlog drains with fewer statements
// than rows, where marking each row as its start returned and claiming at
// every free slot took about two a row.
func TestRunMarksStartedRowsWithItsNextClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rows, conc = 48, 8
	b.starter.setFail(func(outbox.Request) error { time.Sleep(5 * time.Millisecond); return nil })
	ids := b.createOrders(t, rows)
	db := &countingDB{DB: b.pool}
	b.drainWithRun(t, db, conc, nil)
	b.requireOneRunEach(t, ids)
	require.Zero(t, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE run_id IS NULL OR claimed_by IS NOT NULL`))
	t.Logf("marking with claims: %d claims, %d marks for %d rows", db.claims.Load(), db.marks.Load(), rows)

	old := setup(t)
	old.starter.setFail(func(outbox.Request) error { time.Sleep(5 * time.Millisecond); return nil })
	old.createOrders(t, rows)
	oldDB := &countingDB{DB: old.pool}
	old.drainWithRun(t, oldDB, conc, (*outbox.Relay).MarkEachRowForTest)
	t.Logf("marking each: %d claims, %d marks for %d rows", oldDB.claims.Load(), oldDB.marks.Load(), rows)
	require.Less(t, int(db.claims.Load()+db.marks.Load()), rows, "fewer statements than rows")
	require.EqualValues(t, rows, oldDB.marks.Load(), "the baseline marks each row on its own")
}

// Under Run, a claim that fails with the marks it carries keeps them: the
// next claim marks those rows, and none is started twice.
func TestRunMarksRowsWhoseClaimFailedWithTheNextOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.starter.setFail(func(outbox.Request) error { time.Sleep(5 * time.Millisecond); return nil })
	ids := b.createOrders(t, 24)
	db := &failingDB{DB: b.pool, match: "WITH marked"}
	db.fail.Store(2)
	b.drainWithRun(t, db, 8, nil)
	require.Negative(t, db.fail.Load(), "claims carrying marks failed")
	require.Zero(t, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE run_id IS NULL OR claimed_by IS NOT NULL`))
	calls, _ := b.starter.counts()
	for _, id := range ids {
		require.Equal(t, 1, calls[orders.WorkflowID(b.tenant, id)], "one start for %s", id)
	}
	b.requireOneRunEach(t, ids)
}
