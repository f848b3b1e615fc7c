package tests

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fakeproviders"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/workflows"
	orderflow "github.com/keyedhq/keyed/workflows/order"
	refundflow "github.com/keyedhq/keyed/workflows/refund"
)

const (
	stripeKey   = "sk_test_e2e"
	sendgridKey = "SG.e2e"
	receiptFrom = "receipts@shop.example"
)

// bundle is one test's world: its own schema, tenant, task queue and fakes.
type bundle struct {
	ctx       context.Context
	dbURL     string
	pool      *pgxpool.Pool
	effects   *effects.Client
	orders    *orders.Store
	stripe    *fakestripe.Server
	stripeURL string
	mail      *fakesendgrid.Server
	mailURL   string
	// otherProviders is what a worker process needs beyond the fakes
	// above: the fakes of every other provider and the examples of the
	// settings the worker requires (fakeproviders.Complete).
	otherProviders []string
	temporal       client.Client
	taskQueue      string
	tenant         string
	// deps binds the steps of the test's workers: its database, effects
	// client and the provider clients pointed at the fakes.
	deps pipeline.Deps
}

func setup(t testing.TB) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	_, url := effectstest.NewSchema(t)
	b := newBundle(t, ctx, url, url, "e2e-", temporalAddr)
	b.deps = b.newDeps(t)
	return b
}

// newBundle connects a bundle to the database (poolURL for the test's own
// pool, dbURL for the workers it spawns) and to Temporal at addr, starts
// the fakes, and gives it a tenant and a task queue named queue and a
// random suffix.
func newBundle(t testing.TB, ctx context.Context, poolURL, dbURL, queue, addr string) *bundle {
	t.Helper()
	pool := dbtest.Connect(t, poolURL)
	b := &bundle{
		ctx:       ctx,
		dbURL:     dbURL,
		pool:      pool,
		effects:   effectstest.NewClient(t, pool, &effects.ClientOpts{Logger: quiet()}),
		stripe:    fakestripe.New(nil),
		mail:      fakesendgrid.New(nil),
		taskQueue: queue + randomID(),
		tenant:    "t" + randomID(),
	}
	var err error
	b.orders, err = orders.NewStore(pool)
	require.NoError(t, err)
	stripeSrv := httptest.NewServer(b.stripe)
	t.Cleanup(stripeSrv.Close)
	mailSrv := httptest.NewServer(b.mail)
	t.Cleanup(mailSrv.Close)
	b.stripeURL, b.mailURL = stripeSrv.URL, mailSrv.URL
	ours := b.workerEnv()
	b.otherProviders = fakeproviders.CompleteT(t, ours)[len(ours):]
	b.temporal, err = client.Dial(client.Options{HostPort: addr, Logger: quietSDK()})
	require.NoError(t, err, "dial Temporal at %s", addr)
	t.Cleanup(b.temporal.Close)
	return b
}

// newDeps returns the steps' dependencies over the test's database and
// fakes, the sender's options edited by edit.
func (b *bundle) newDeps(t testing.TB, edit ...func(*notify.SenderOpts)) pipeline.Deps {
	t.Helper()
	sc, err := stripestep.NewClient(stripeKey, b.stripeURL, nil)
	require.NoError(t, err)
	so := &notify.SenderOpts{APIKey: sendgridKey, BaseURL: b.mailURL, From: receiptFrom, Logger: quiet()}
	for _, e := range edit {
		e(so)
	}
	sender, err := notify.NewSender(b.effects, b.pool, so)
	require.NoError(t, err)
	return pipeline.Deps{DB: b.pool, Effects: b.effects, Logger: quiet(), Providers: b.providers(t, b.pool, b.effects, sc, sender)}
}

// workerEnv returns a worker process's provider settings: the bundle's
// Stripe and SendGrid at their URLs as they are now (a test may put a
// proxy in front of them) and the other providers' fakes.
func (b *bundle) workerEnv() []string {
	return append([]string{"STRIPE_SECRET_KEY=" + stripeKey, "STRIPE_API_BASE=" + b.stripeURL,
		"SENDGRID_API_KEY=" + sendgridKey, "SENDGRID_API_BASE=" + b.mailURL, "RECEIPT_FROM=" + receiptFrom}, b.otherProviders...)
}

// providers returns own, the clients a test binds its steps with, and
// after them every provider the worker builds from the bundle's worker
// settings (fxapptest.Providers), so that a step added with a provider of
// its own finds its client, pointed at its fake.
func (b *bundle) providers(t testing.TB, pool *pgxpool.Pool, claims *effects.Client, own ...any) []any {
	t.Helper()
	env := map[string]string{}
	for _, kv := range b.workerEnv() {
		name, value, _ := strings.Cut(kv, "=")
		env[name] = value
	}
	return append(own, fxapptest.Providers(t, env, pool, claims)...)
}

// startWorker runs an in-process worker on the test's task queue until the
// test ends.
func (b *bundle) startWorker(t *testing.T) worker.Worker {
	t.Helper()
	w := worker.New(b.temporal, b.taskQueue, worker.Options{})
	require.NoError(t, pipeline.Register(w, workflows.Pipelines(), b.deps, nil))
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	return w
}

// order creates a pending order for the test's tenant.
func (b *bundle) order(t testing.TB, id string, amount int64, pm string) *orders.Order {
	t.Helper()
	o, created, err := b.orders.Create(b.ctx, orders.NewOrder{
		TenantID: b.tenant, ID: id, AmountMinor: amount, Currency: "eur",
		CustomerEmail: "ada@example.com", PaymentMethod: pm,
	})
	require.NoError(t, err)
	require.True(t, created)
	return o
}

func (b *bundle) start(t *testing.T, in orders.OrderInput) *outbox.Started {
	t.Helper()
	st, err := orderflow.Start(b.ctx, b.temporal, in, &orderflow.StartOpts{TaskQueue: b.taskQueue})
	require.NoError(t, err)
	return st
}

// startOrder starts in's order run with pipeline.Start, as every starter
// startRefund starts in's refund run on taskQueue with pipeline.Start and
// returns the run it led to.
func startRefund(ctx context.Context, c client.Client, in refunds.RefundInput, taskQueue string) (client.WorkflowRun, error) {
	st, err := pipeline.Start(ctx, c, refundflow.StartOptions(in, taskQueue), refunds.WorkflowName, in)
	if err != nil {
		return nil, err
	}
	return c.GetWorkflow(ctx, st.WorkflowID, st.RunID), nil
}

// wait waits for the run to finish and returns its result and error.
func (b *bundle) wait(t *testing.T, st *outbox.Started) (orders.OrderResult, error) {
	t.Helper()
	var res orders.OrderResult
	err := b.temporal.GetWorkflow(b.ctx, st.WorkflowID, st.RunID).Get(b.ctx, &res)
	return res, err
}

// history returns the events of run st.
func (b *bundle) history(t *testing.T, st *outbox.Started) []*historypb.HistoryEvent {
	t.Helper()
	var events []*historypb.HistoryEvent
	it := b.temporal.GetWorkflowHistory(b.ctx, st.WorkflowID, st.RunID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		require.NoError(t, err)
		events = append(events, e)
	}
	return events
}

// scheduledActivities returns the activity type of each activity task
// events scheduled, in order: the steps that went through the task queue.
func scheduledActivities(events []*historypb.HistoryEvent) []string {
	var names []string
	for _, e := range events {
		if a := e.GetActivityTaskScheduledEventAttributes(); a != nil {
			names = append(names, a.GetActivityType().GetName())
		}
	}
	return names
}

// recordHistory writes events where KEYED_RECORD_HISTORY says, as
// `temporal workflow show --output json` does, for a replay test's
// testdata; it does nothing when the variable is unset.
func recordHistory(t *testing.T, events []*historypb.HistoryEvent) {
	t.Helper()
	path := os.Getenv("KEYED_RECORD_HISTORY")
	if path == "" {
		return
	}
	out, err := protojson.MarshalOptions{Multiline: true}.Marshal(&historypb.History{Events: events})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append(out, '\n'), 0o644))
}

// records returns the order's effect records by kind, with the
// self-guarded steps' transitions (orders.Store.Effects).
func (b *bundle) records(t *testing.T, orderID string) map[string]*effects.Record {
	t.Helper()
	prefix, err := orders.OrderKey(b.tenant, orderID)
	require.NoError(t, err)
	recs, err := b.orders.Effects(b.ctx, b.effects, prefix)
	require.NoError(t, err)
	out := map[string]*effects.Record{}
	for _, r := range recs {
		out[r.Kind] = r
	}
	return out
}

// runs counts the workflow executions with the order's workflow ID.
func (b *bundle) runs(t *testing.T, workflowID string) int {
	t.Helper()
	n := 0
	var token []byte
	for {
		resp, err := b.temporal.ListWorkflow(b.ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: "default", Query: "WorkflowId = '" + workflowID + "'", NextPageToken: token,
		})
		require.NoError(t, err)
		n += len(resp.Executions)
		if token = resp.NextPageToken; len(token) == 0 {
			return n
		}
	}
}

// randomID returns 10 random lowercase letters and digits.
func randomID() string {
	return strings.ToLower(rand.Text())[:10]
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func quietSDK() sdklog.Logger { return sdklog.NewStructuredLogger(quiet()) }
