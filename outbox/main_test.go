package outbox_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// temporalAddr is the dev server every test in the package shares. Tests
// keep apart by tenant and task queue.
var temporalAddr string

func TestMain(m *testing.M) {
	os.Exit(devserver.RunTests(m, "outbox", func(s *devserver.Server) { temporalAddr = s.Address() }))
}

type bundle struct {
	ctx       context.Context
	pool      *pgxpool.Pool
	store     *orders.Store
	temporal  client.Client
	taskQueue string
	tenant    string
	starter   *countingStarter
	logger    *slog.Logger
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := dbtest.NewPool(t, &effectstest.PoolOpts{MaxConns: 24})
	store, err := orders.NewStore(pool)
	require.NoError(t, err)
	c, err := client.Dial(client.Options{HostPort: temporalAddr, Logger: quietLogger{}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	b := &bundle{
		ctx:       context.Background(),
		pool:      pool,
		store:     store,
		temporal:  c,
		taskQueue: "outbox-test-" + randomID(4),
		tenant:    "t" + randomID(4),
		logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	// The worker relay's own starter, on a task queue no worker polls: the
	// run exists in Temporal, which is what these tests count, and nothing
	// executes it.
	b.starter = &countingStarter{next: orderStarter(c, b.taskQueue), calls: map[string]int{}, created: map[string]int{}}
	return b
}

// orderStarter is the production starter of order runs, as internal/fxapp
// wires it, on queue and without a store.
func orderStarter(c client.Client, queue string) *temporalstart.Starter {
	return temporalstart.New(c, &temporalstart.Opts{TaskQueue: queue, Configure: pipeline.Configure(workflows.Pipelines(), nil)})
}

// orderOf returns the order ID of an order run's request, and "" for any
// other request.
func orderOf(req outbox.Request) string {
	in, _, err := orders.FromStartRequest(req)
	if err != nil {
		return ""
	}
	return in.OrderID
}

// countingStarter counts every start call and every new run per workflow
// ID, and fails calls while fail returns an error.
type countingStarter struct {
	next outbox.Starter

	mu      sync.Mutex
	calls   map[string]int
	created map[string]int
	fail    func(req outbox.Request) error
}

func (s *countingStarter) Start(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
	s.mu.Lock()
	s.calls[req.WorkflowID]++
	fail := s.fail
	s.mu.Unlock()
	if fail != nil {
		if err := fail(req); err != nil {
			return nil, err
		}
	}
	st, err := s.next.Start(ctx, req)
	if err == nil && st.Created {
		s.mu.Lock()
		s.created[req.WorkflowID]++
		s.mu.Unlock()
	}
	return st, err
}

func (s *countingStarter) setFail(f func(req outbox.Request) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = f
}

func (s *countingStarter) counts() (calls, created map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	calls, created = map[string]int{}, map[string]int{}
	for k, v := range s.calls {
		calls[k] = v
	}
	for k, v := range s.created {
		created[k] = v
	}
	return calls, created
}

func (b *bundle) newOrder(id string) orders.NewOrder {
	return orders.NewOrder{TenantID: b.tenant, ID: id, AmountMinor: 1999, Currency: "usd",
		CustomerEmail: "ada@example.com", PaymentMethod: "pm_card_visa"}
}

// createOrders commits n orders, each with its outbox row, in one
// transaction, and returns their IDs.
func (b *bundle) createOrders(t *testing.T, n int) []string {
	t.Helper()
	return b.createOrdersWithPrefix(t, "ord", n)
}

func (b *bundle) createOrdersWithPrefix(t *testing.T, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for i := range ids {
			ids[i] = fmt.Sprintf("%s_%04d", prefix, i)
			if _, _, err := b.store.CreateAndEnqueueTx(b.ctx, tx, b.newOrder(ids[i])); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	return ids
}

func (b *bundle) relay(t *testing.T, opts *outbox.RelayOpts) *outbox.Relay {
	t.Helper()
	if opts == nil {
		opts = &outbox.RelayOpts{}
	}
	if opts.Logger == nil {
		opts.Logger = b.logger
	}
	r, err := outbox.NewRelay(b.pool, b.starter, opts)
	require.NoError(t, err)
	return r
}

// runUntilSent runs r until no row is unsent, within 30 seconds, then
// stops it and requires that it stopped cleanly.
func (b *bundle) runUntilSent(t *testing.T, r *outbox.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return b.unsent(t) == 0 }, 30*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, sql, args...).Scan(&n))
	return n
}

func (b *bundle) unsent(t *testing.T) int {
	return b.count(t, `SELECT count(*) FROM keyed_outbox WHERE sent_at IS NULL`)
}

// runs counts the workflow runs Temporal holds on the bundle's task queue.
func (b *bundle) runs(t *testing.T) int {
	t.Helper()
	resp, err := b.temporal.CountWorkflow(b.ctx, &workflowservice.CountWorkflowExecutionsRequest{
		Query: fmt.Sprintf("TaskQueue = '%s'", b.taskQueue),
	})
	require.NoError(t, err)
	return int(resp.GetCount())
}

// requireRunIDs checks that Temporal has exactly one run of each workflow.
func (b *bundle) requireOneRunEach(t *testing.T, ids []string) {
	t.Helper()
	require.Eventually(t, func() bool { return b.runs(t) == len(ids) }, 20*time.Second, 100*time.Millisecond,
		"Temporal should hold exactly %d runs on %s", len(ids), b.taskQueue)
	for _, id := range ids {
		_, err := b.temporal.DescribeWorkflow(b.ctx, orders.WorkflowID(b.tenant, id), "")
		require.NoError(t, err, "workflow for %s", id)
	}
}

// randomID returns 2n random lowercase letters and digits (n at most 13).
func randomID(n int) string {
	return strings.ToLower(rand.Text())[:2*n]
}

type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}
