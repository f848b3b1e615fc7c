package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/converter"

	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
)

func TestCreateAndEnqueueTxCommitsOrderAndStartRequestTogether(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var created bool
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		_, created, err = b.store.CreateAndEnqueueTx(b.ctx, tx, b.newOrder("ord_1"))
		return err
	})
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM orders`))
	require.Equal(t, 1, b.unsent(t))

	var workflowType, workflowID, payload, meta string
	var taskQueue *string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT workflow_type, workflow_id, task_queue, payload::text, meta::text FROM keyed_outbox`).
		Scan(&workflowType, &workflowID, &taskQueue, &payload, &meta))
	require.Equal(t, orders.WorkflowName, workflowType)
	require.Equal(t, orders.WorkflowID(b.tenant, "ord_1"), workflowID)
	require.Nil(t, taskQueue, "the relay's starter picks the queue")
	require.JSONEq(t, `{"v":1,"tenant_id":"`+b.tenant+`","order_id":"ord_1"}`, payload, "identifiers and a version, never the order")
	require.JSONEq(t, `{"amount_minor":"1999","currency":"usd"}`, meta, "the amount, for the run's summary")
	entry, err := outbox.Get(b.ctx, b.pool, workflowID)
	require.NoError(t, err)
	require.Equal(t, orders.WorkflowName, entry.WorkflowType)
	require.Equal(t, b.tenant, entry.TenantID)

	// A retried handler: same order, one order row, one start request.
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		_, created, err = b.store.CreateAndEnqueueTx(b.ctx, tx, b.newOrder("ord_1"))
		return err
	})
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM orders`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox`))
}

// A rollback after the order write leaves no order, no outbox row, and so
// nothing for any relay to start.
func TestRollbackLeavesNoOutboxRowAndStartsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := errors.New("payment provider said no after the order write")
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, _, err := b.store.CreateAndEnqueueTx(b.ctx, tx, b.newOrder("ord_rb")); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM orders`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM keyed_outbox`))

	n, err := b.relay(t, nil).Poll(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	calls, _ := b.starter.counts()
	require.Empty(t, calls)
	_, err = b.temporal.DescribeWorkflow(b.ctx, orders.WorkflowID(b.tenant, "ord_rb"), "")
	var notFound *serviceerror.NotFound
	require.ErrorAs(t, err, &notFound)
}

func TestCreateAndEnqueueTxRefusesBadInputAndConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := b.newOrder("ord_bad")
	bad.AmountMinor = 0
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := b.store.CreateAndEnqueueTx(b.ctx, tx, bad)
		return err
	})
	var verr *orders.ValidationError
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "amount_minor", verr.Field)

	b.createOrders(t, 1)
	other := b.newOrder("ord_0000")
	other.AmountMinor = 5
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := b.store.CreateAndEnqueueTx(b.ctx, tx, other)
		return err
	})
	require.ErrorIs(t, err, orders.ErrConflict)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox`))

	var noStore *orders.Store
	_, _, err = noStore.CreateAndEnqueueTx(b.ctx, nil, b.newOrder("x"))
	require.Error(t, err)
}

func TestEnqueueTxValidatesTheRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	valid := outbox.Request{WorkflowType: "W", WorkflowID: "w:" + b.tenant, Payload: json.RawMessage(`{}`)}
	for name, mutate := range map[string]func(*outbox.Request){
		"no type":          func(r *outbox.Request) { r.WorkflowType = "" },
		"no ID":            func(r *outbox.Request) { r.WorkflowID = "" },
		"no payload":       func(r *outbox.Request) { r.Payload = nil },
		"payload not JSON": func(r *outbox.Request) { r.Payload = json.RawMessage(`{"v":`) },
	} {
		req := valid
		mutate(&req)
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := outbox.EnqueueTx(b.ctx, tx, req)
			return err
		})
		require.ErrorIs(t, err, outbox.ErrInvalid, name)
	}
	_, err := outbox.EnqueueTx(b.ctx, nil, valid)
	require.Error(t, err)
	require.Zero(t, b.count(t, `SELECT count(*) FROM keyed_outbox`))

	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := orders.EnqueueTx(b.ctx, tx, orders.OrderInput{V: 99, TenantID: b.tenant, OrderID: "o"}, nil)
		return err
	})
	require.ErrorIs(t, err, outbox.ErrInvalid)
	require.ErrorIs(t, err, step.ErrUnsupportedVersion)

	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		first, err := orders.EnqueueTx(b.ctx, tx, orders.NewOrderInput(b.tenant, "o"), nil)
		require.NoError(t, err)
		require.True(t, first)
		again, err := orders.EnqueueTx(b.ctx, tx, orders.NewOrderInput(b.tenant, "o"), nil)
		require.NoError(t, err)
		require.False(t, again)
		return nil
	})
	require.NoError(t, err)
}

func TestStatsAndPrune(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, err := outbox.ReadStats(b.ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{}, s)

	b.createOrders(t, 3)
	_, err = b.pool.Exec(b.ctx, `UPDATE keyed_outbox SET created_at = now() - interval '90 seconds' WHERE workflow_id LIKE '%ord_0000%'`)
	require.NoError(t, err)
	s, err = outbox.ReadStats(b.ctx, b.pool)
	require.NoError(t, err)
	require.EqualValues(t, 3, s.Depth)
	require.InDelta(t, 90, s.OldestAge.Seconds(), 5)

	_, err = b.relay(t, nil).Poll(b.ctx)
	require.NoError(t, err)
	s, err = outbox.ReadStats(b.ctx, b.pool)
	require.NoError(t, err)
	require.Equal(t, outbox.Stats{}, s)

	// Only rows sent before the retention go.
	_, err = b.pool.Exec(b.ctx, `UPDATE keyed_outbox SET sent_at = now() - interval '8 days' WHERE workflow_id LIKE '%ord_0001%'`)
	require.NoError(t, err)
	n, err := outbox.Prune(b.ctx, b.pool, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM keyed_outbox`))

	_, err = outbox.Prune(b.ctx, b.pool, &outbox.PruneOpts{Retention: time.Minute})
	require.Error(t, err)
}

func TestNewRelayValidatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	starter := outbox.StarterFunc(func(context.Context, outbox.Request) (*outbox.Started, error) { return nil, nil })
	_, err := outbox.NewRelay(nil, starter, nil)
	require.Error(t, err)
	_, err = outbox.NewRelay(b.pool, nil, nil)
	require.Error(t, err)
	for _, opts := range []*outbox.RelayOpts{
		{BatchSize: 20_000},
		{Lease: 500 * time.Millisecond},
		{Lease: 5 * time.Second, StartTimeout: 4 * time.Second},
		{MinBackoff: time.Minute, MaxBackoff: time.Second},
		{Concurrency: 1001},
		{Concurrency: -1},
		{Lease: 2 * time.Second, StartTimeout: time.Second, RecordTimeout: 3 * time.Second},
		{PollInterval: -time.Second},
		{Retention: time.Minute},
	} {
		_, err := outbox.NewRelay(b.pool, starter, opts)
		require.Error(t, err, "%+v", opts)
	}
	r, err := outbox.NewRelay(b.pool, starter, &outbox.RelayOpts{Name: "relay-a"})
	require.NoError(t, err)
	require.Equal(t, "relay-a", r.Name())
}

// The row carries the order's amount from the enqueueing transaction, so
// the production starter puts it in the run's summary, beside the search
// attributes, without loading the order (it has no store here to load it
// from).
func TestRowCarriesTheAmountToTheRunSummary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.createOrders(t, 1)
	r, err := outbox.NewRelay(b.pool, orderStarter(b.temporal, b.taskQueue), &outbox.RelayOpts{Logger: b.logger})
	require.NoError(t, err)
	n, err := r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	desc, err := b.temporal.DescribeWorkflow(b.ctx, orders.WorkflowID(b.tenant, ids[0]), "")
	require.NoError(t, err)
	var summary string
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(desc.RawResponse.GetExecutionConfig().GetUserMetadata().GetSummary(), &summary))
	require.Equal(t, "tenant "+b.tenant+" · order "+ids[0]+" · 19.99 USD", summary)
	requireOrderSearchAttributes(t, desc.RawResponse, b.tenant, ids[0])
	require.Equal(t, b.tenant, desc.RawResponse.GetWorkflowExecutionInfo().GetPriority().GetFairnessKey(), "the tenant is the run's fairness key")
	require.Contains(t, desc.RawResponse.GetWorkflowExecutionInfo().GetMemo().GetFields(), pipeline.MemoLocalSteps)

	// EnqueueTx without the order leaves the amount out.
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := orders.EnqueueTx(b.ctx, tx, orders.NewOrderInput(b.tenant, "no-order-yet"), nil)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE meta IS NULL`))
}

// A row that stops being prunable while Prune waits for it (here it is
// unsent again, by a transaction that held it when Prune read the row
// addresses) is kept: the DELETE checks its condition again on the row as
// it is when it gets it.
func TestPruneKeepsARowChangedWhileItWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.createOrders(t, 2)
	_, err := b.pool.Exec(b.ctx, `UPDATE keyed_outbox SET sent_at = now() - interval '8 days', run_id = 'r'`)
	require.NoError(t, err)
	tx := dbtest.Begin(t, b.pool)
	_, err = tx.Exec(b.ctx, `UPDATE keyed_outbox SET sent_at = NULL WHERE workflow_id LIKE '%ord_0000%'`)
	require.NoError(t, err)
	var holder int
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&holder))

	pruned := make(chan int64, 1)
	go func() {
		n, err := outbox.Prune(b.ctx, b.pool, nil)
		if err != nil {
			t.Error(err)
		}
		pruned <- n
	}()
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, holder) > 0
	}, 5*time.Second, 10*time.Millisecond, "Prune waits for the held row")
	require.NoError(t, tx.Commit(b.ctx))
	require.EqualValues(t, 1, <-pruned, "only the row still sent")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE sent_at IS NULL`))
}
