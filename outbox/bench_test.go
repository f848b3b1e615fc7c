package outbox_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

var (
	benchDuration    = flag.Duration("relay.duration", 10*time.Second, "how long BenchmarkRelayCommitToStart offers load at each rate")
	benchConcurrency = flag.Int("relay.concurrency", 0, "RelayOpts.Concurrency for BenchmarkRelayCommitToStart; 0 means the default")
)

// BenchmarkRelayCommitToStart offers orders at a fixed rate, each committed
// with its outbox row in its own transaction (as the API does), to a relay
// woken by Listen that starts them with the production starter (orderStarter) on
// the shared dev server, and reports the latency from each commit's return
// to its start's return: p50, p99 and max in milliseconds. Beside it,
// "direct" makes the same starts at the same rate with orderflow.Start and
// no outbox: the floor the relay adds to. Run it with `make bench-relay`
// (-benchtime 1x: each iteration is one full load of -relay.duration).
func BenchmarkRelayCommitToStart(b *testing.B) {
	for _, rate := range []int{50, 200} {
		b.Run(fmt.Sprintf("rate=%d/relay", rate), func(b *testing.B) {
			for range b.N {
				reportLatencies(b, relayLoad(b, rate))
			}
		})
		b.Run(fmt.Sprintf("rate=%d/direct", rate), func(b *testing.B) {
			for range b.N {
				reportLatencies(b, directLoad(b, rate))
			}
		})
	}
}

// relayLoad commits orders at rate for benchDuration and returns each
// one's commit-to-start latency.
func relayLoad(b *testing.B, rate int) []time.Duration {
	rig := startRelayRig(b, 16, &outbox.RelayOpts{Concurrency: *benchConcurrency}, nil)
	time.Sleep(200 * time.Millisecond)
	tenant := "bench" + randomID(4)
	committed := offer(b, rate, loadSize(rate), func(i int) (string, error) { return rig.commit(tenant, i, 1) })
	require.Eventually(b, func() bool { return rig.starter.count() >= len(committed) }, time.Minute, 10*time.Millisecond,
		"every committed order is started")
	rig.stop()
	// The start calls alone, inside the latency: the rest is the relay's.
	calls := slices.Sorted(slices.Values(rig.starter.calls))
	b.ReportMetric(percentile(calls, 0.50), "start-p50-ms")
	b.ReportMetric(percentile(calls, 0.99), "start-p99-ms")
	return rig.starter.since(committed)
}

// relayRig is a relay benchmark's setup: a schema of its own, an order
// store on a pool of its own (the API's), and a relay on another, woken by
// Listen, starting orders with the production starter (orderStarter) on
// the shared dev server and timing each start.
type relayRig struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	store   *orders.Store
	starter *timedStarter
	// stop stops the relay and requires that it stopped cleanly.
	stop func()
}

// startRelayRig sets a rig up with apiConns connections for the store and
// runs its relay with opts (Wake and Logger are the rig's) until stop, or
// the benchmark's end. tune, if set, adjusts the relay before it runs. It
// returns once the relay listens and its first poll is under way.
func startRelayRig(b *testing.B, apiConns int32, opts *outbox.RelayOpts, tune func(*outbox.Relay)) *relayRig {
	_, url := effectstest.NewSchema(b)
	rig := &relayRig{pool: dbtest.Connect(b, url, &effectstest.PoolOpts{MaxConns: apiConns})}
	relayPool := dbtest.Connect(b, url, &effectstest.PoolOpts{MaxConns: 8})
	var err error
	rig.store, err = orders.NewStore(rig.pool)
	require.NoError(b, err)
	rig.starter = &timedStarter{next: orderStarter(dialBench(b), "outbox-bench-"+randomID(4)), at: map[string]time.Time{}}

	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	rig.ctx = ctx
	wake := make(chan struct{}, 1)
	go outbox.Listen(ctx, relayPool, wake, quietSlog())
	o := *opts
	o.Wake, o.Logger = wake, quietSlog()
	r, err := outbox.NewRelay(relayPool, rig.starter, &o)
	require.NoError(b, err)
	if tune != nil {
		tune(r)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	rig.stop = func() {
		cancel()
		require.NoError(b, <-done)
	}
	<-wake // listening; the relay's first poll is under way
	return rig
}

// commit commits n orders of tenant, numbered from first, with their
// outbox rows in one transaction, as the API does, and returns the
// workflow ID of the first.
func (rig *relayRig) commit(tenant string, first, n int) (string, error) {
	err := commitOrders(rig.ctx, rig.pool, rig.store, tenant, first, n)
	return orders.WorkflowID(tenant, fmt.Sprintf("o%06d", first)), err
}

// commitOrders commits n orders of tenant, numbered from first, with their
// outbox rows in one transaction, as the API does.
func commitOrders(ctx context.Context, pool *pgxpool.Pool, store *orders.Store, tenant string, first, n int) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := first; i < first+n; i++ {
			o := orders.NewOrder{TenantID: tenant, ID: fmt.Sprintf("o%06d", i), AmountMinor: 1999, Currency: "usd",
				CustomerEmail: "ada@example.com", PaymentMethod: "pm_card_visa"}
			if _, _, err := store.CreateAndEnqueueTx(ctx, tx, o); err != nil {
				return err
			}
		}
		return nil
	})
}

// directLoad starts runs at rate for benchDuration with orderflow.Start and
// returns each call's latency.
func directLoad(b *testing.B, rate int) []time.Duration {
	c := dialBench(b)
	tenant, queue := "bench"+randomID(4), "outbox-bench-"+randomID(4)
	var mu sync.Mutex
	var lat []time.Duration
	offer(b, rate, loadSize(rate), func(i int) (string, error) {
		began := time.Now()
		in := orders.NewOrderInput(tenant, fmt.Sprintf("o%06d", i))
		_, err := orderflow.Start(context.Background(), c, in, &orderflow.StartOpts{TaskQueue: queue})
		mu.Lock()
		lat = append(lat, time.Since(began))
		mu.Unlock()
		return in.WorkflowID(), err
	})
	return lat
}

// loadSize is how many calls offer makes at rate in benchDuration.
func loadSize(rate int) int { return int(benchDuration.Seconds() * float64(rate)) }

// offer calls do for 0, 1, …, n-1 at rate per second, each call in its own
// goroutine (an open load: a slow call delays nobody), and returns when
// each successful call returned, by the workflow ID it names.
func offer(b *testing.B, rate, n int, do func(i int) (string, error)) map[string]time.Time {
	var mu sync.Mutex
	var wg sync.WaitGroup
	done := map[string]time.Time{}
	var errs []error
	interval := time.Second / time.Duration(rate)
	began := time.Now()
	for i := range n {
		time.Sleep(time.Until(began.Add(time.Duration(i) * interval)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := do(i)
			at := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			done[id] = at
		}()
	}
	offered := float64(n) / time.Since(began).Seconds()
	wg.Wait()
	b.ReportMetric(offered, "offered/s")
	// An overloaded server times calls out: count them as a figure (they
	// are left out of the latencies) rather than hide the others.
	b.ReportMetric(float64(len(errs)), "errors")
	if len(errs) > 0 {
		b.Logf("%d of %d calls failed; the first: %v", len(errs), n, errs[0])
	}
	return done
}

func reportLatencies(b *testing.B, lat []time.Duration) {
	b.Helper()
	require.NotEmpty(b, lat)
	slices.Sort(lat)
	b.ReportMetric(percentile(lat, 0.50), "p50-ms")
	b.ReportMetric(percentile(lat, 0.99), "p99-ms")
	b.ReportMetric(percentile(lat, 1), "max-ms")
	b.ReportMetric(loadAverage(), "load1")
	b.ReportMetric(0, "ns/op") // one iteration is one whole load: ns/op says nothing
}

// percentile returns the p-th percentile of sorted in milliseconds.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(p*float64(len(sorted))))
	return float64(sorted[i].Microseconds()) / 1000
}

// timedStarter records when each start returned, and how long the call
// took.
type timedStarter struct {
	next  outbox.Starter
	mu    sync.Mutex
	at    map[string]time.Time
	calls []time.Duration
}

func (s *timedStarter) Start(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
	began := time.Now()
	st, err := s.next.Start(ctx, req)
	if err == nil {
		s.mu.Lock()
		if _, ok := s.at[st.WorkflowID]; !ok {
			s.at[st.WorkflowID] = time.Now()
			s.calls = append(s.calls, time.Since(began))
		}
		s.mu.Unlock()
	}
	return st, err
}

func (s *timedStarter) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}

// since returns, for each committed workflow ID, the time from its commit
// to its start.
func (s *timedStarter) since(committed map[string]time.Time) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	lat := make([]time.Duration, 0, len(committed))
	for id, at := range committed {
		lat = append(lat, s.at[id].Sub(at))
	}
	return lat
}

func quietSlog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func dialBench(b *testing.B) client.Client {
	c, err := client.Dial(client.Options{HostPort: temporalAddr, Logger: quietLogger{}})
	require.NoError(b, err)
	b.Cleanup(c.Close)
	return c
}

// loadAverage returns the machine's one-minute load average, so that the
// figures say how busy the machine was.
func loadAverage() float64 {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f, err := strconv.ParseFloat(strings.Fields(string(raw))[0], 64)
	if err != nil {
		return -1
	}
	return f
}
