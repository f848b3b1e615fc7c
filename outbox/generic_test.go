package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/migrations"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/outbox/temporalstart"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// The outbox starts any workflow: its type, ID, task queue and JSON payload
// come from the row, the payload reaches Temporal as the workflow's JSON
// input, Meta reaches the Configure hook, and a second start of the ID
// collapses into the first run.
func TestRelayStartsAnyWorkflowType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ownQueue := b.taskQueue + "-greetings"
	greet := outbox.Request{WorkflowType: "GreetingWorkflow", WorkflowID: "greeting:" + b.tenant + ":1", TaskQueue: ownQueue,
		Payload: json.RawMessage(`{"v":2,"name":"Ada"}`), Meta: map[string]string{"summary": "greet Ada"}}
	plain := outbox.Request{WorkflowType: "PlainWorkflow", WorkflowID: "plain:" + b.tenant, Payload: json.RawMessage(`[1,2]`)}
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for _, req := range []outbox.Request{greet, plain} {
			if _, err := outbox.EnqueueTx(b.ctx, tx, req); err != nil {
				return err
			}
		}
		return nil
	}))

	orderHook := pipeline.Configure(workflows.Pipelines(), nil)
	starter := temporalstart.New(b.temporal, &temporalstart.Opts{TaskQueue: b.taskQueue,
		Configure: func(ctx context.Context, req outbox.Request, o *client.StartWorkflowOptions) error {
			if err := orderHook(ctx, req, o); err != nil {
				return err
			}
			o.StaticSummary = req.Meta["summary"]
			o.ID = "the hook cannot move the ID"
			return nil
		}})
	r, err := outbox.NewRelay(b.pool, starter, &outbox.RelayOpts{Logger: b.logger})
	require.NoError(t, err)
	n, err := r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	desc, err := b.temporal.DescribeWorkflow(b.ctx, greet.WorkflowID, "")
	require.NoError(t, err)
	info := desc.RawResponse.GetWorkflowExecutionInfo()
	require.Equal(t, "GreetingWorkflow", info.GetType().GetName())
	require.Equal(t, ownQueue, info.GetTaskQueue())
	require.Equal(t, "greet Ada", decodeString(t, desc.RawResponse.GetExecutionConfig().GetUserMetadata().GetSummary()))
	require.Empty(t, info.GetSearchAttributes().GetIndexedFields(), "the order hook leaves other workflows alone")
	require.JSONEq(t, `{"v":2,"name":"Ada"}`, firstInput(t, b.temporal, greet.WorkflowID))

	desc, err = b.temporal.DescribeWorkflow(b.ctx, plain.WorkflowID, "")
	require.NoError(t, err)
	require.Equal(t, b.taskQueue, desc.RawResponse.GetWorkflowExecutionInfo().GetTaskQueue(), "the starter's default queue")
	require.JSONEq(t, `[1,2]`, firstInput(t, b.temporal, plain.WorkflowID))
	entry, err := outbox.Get(b.ctx, b.pool, plain.WorkflowID)
	require.NoError(t, err)
	require.Equal(t, "PlainWorkflow", entry.WorkflowType)
	require.Empty(t, entry.TenantID)

	again, err := starter.Start(b.ctx, greet)
	require.NoError(t, err)
	require.False(t, again.Created)
	sent, err := outbox.Get(b.ctx, b.pool, greet.WorkflowID)
	require.NoError(t, err)
	require.Equal(t, sent.RunID, again.RunID, "the second start collapsed into the first run")

	_, err = temporalstart.New(b.temporal, nil).Start(b.ctx, outbox.Request{WorkflowType: "W", WorkflowID: "w:" + b.tenant})
	require.ErrorIs(t, err, outbox.ErrInvalid, "no task queue anywhere")
}

// A row written by code from before migration 0012, after the migration ran
// (a rolling deploy), is started as before: the order starter loads the
// order for the amount the row does not carry in its meta.
func TestRowOfTheOldShapeIsStillStarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, _, err := b.store.Create(b.ctx, b.newOrder("ord_old"))
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		return enqueueOldShape(b.ctx, tx, orders.NewOrderInput(b.tenant, "ord_old"))
	}))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE meta IS NULL AND task_queue IS NULL AND amount_minor = 1999`))

	starter := pipeline.Starter(b.temporal, b.pool, b.taskQueue, workflows.Pipelines())
	r, err := outbox.NewRelay(b.pool, starter, &outbox.RelayOpts{Logger: b.logger})
	require.NoError(t, err)
	n, err := r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	wf := orders.WorkflowID(b.tenant, "ord_old")
	desc, err := b.temporal.DescribeWorkflow(b.ctx, wf, "")
	require.NoError(t, err)
	require.Equal(t, orders.WorkflowName, desc.RawResponse.GetWorkflowExecutionInfo().GetType().GetName())
	require.Equal(t, "tenant "+b.tenant+" · order ord_old · 19.99 USD", decodeString(t, desc.RawResponse.GetExecutionConfig().GetUserMetadata().GetSummary()))
	requireOrderSearchAttributes(t, desc.RawResponse, b.tenant, "ord_old")
	require.JSONEq(t, `{"v":1,"tenant_id":"`+b.tenant+`","order_id":"ord_old"}`, firstInput(t, b.temporal, wf))
}

// Migration 0012 on a database holding rows of the old shape: the unsent
// row gets its amount in meta, the sent one is left alone, old code's insert
// still works, and the relay starts the unsent row with its amount and no
// store to load it from.
func TestMigration0012KeepsOldRowsRelayable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A schema with every migration, its outbox taken back to the shape
	// before 0012 (0004, 0007 and 0008).
	pool := dbtest.NewPool(t, &effectstest.PoolOpts{MaxConns: 8})
	_, err := pool.Exec(b.ctx, `ALTER TABLE keyed_outbox DROP COLUMN task_queue, DROP COLUMN meta, ALTER COLUMN tenant_id SET NOT NULL`)
	require.NoError(t, err)
	all, err := migrations.All()
	require.NoError(t, err)
	var m0012 string
	for _, m := range all {
		if m.Version == 12 {
			m0012 = m.SQL
		}
	}
	require.NotEmpty(t, m0012)
	require.NoError(t, pgx.BeginFunc(b.ctx, pool, func(tx pgx.Tx) error {
		for _, id := range []string{"ord_unsent", "ord_sent"} {
			if err := enqueueOldShape(b.ctx, tx, orders.NewOrderInput(b.tenant, id)); err != nil {
				return err
			}
		}
		// No order rows: the old statement found the amount in orders, so
		// these carry it as the old code wrote it.
		_, err := tx.Exec(b.ctx, `UPDATE keyed_outbox SET amount_minor = 1999, currency = 'usd'`)
		if err != nil {
			return err
		}
		_, err = tx.Exec(b.ctx, `UPDATE keyed_outbox SET sent_at = now(), run_id = 'r' WHERE workflow_id = $1`, orders.WorkflowID(b.tenant, "ord_sent"))
		return err
	}))

	_, err = pool.Exec(b.ctx, m0012)
	require.NoError(t, err)
	var meta []byte
	require.NoError(t, pool.QueryRow(b.ctx, `SELECT meta FROM keyed_outbox WHERE workflow_id = $1`, orders.WorkflowID(b.tenant, "ord_unsent")).Scan(&meta))
	require.JSONEq(t, `{"amount_minor":"1999","currency":"usd"}`, string(meta))
	var sentMeta *string
	require.NoError(t, pool.QueryRow(b.ctx, `SELECT meta::text FROM keyed_outbox WHERE workflow_id = $1`, orders.WorkflowID(b.tenant, "ord_sent")).Scan(&sentMeta))
	require.Nil(t, sentMeta)
	require.NoError(t, pgx.BeginFunc(b.ctx, pool, func(tx pgx.Tx) error {
		return enqueueOldShape(b.ctx, tx, orders.NewOrderInput(b.tenant, "ord_after"))
	}), "old code's insert works after the migration")

	r, err := outbox.NewRelay(pool, orderStarter(b.temporal, b.taskQueue), &outbox.RelayOpts{Logger: b.logger})
	require.NoError(t, err)
	n, err := r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	desc, err := b.temporal.DescribeWorkflow(b.ctx, orders.WorkflowID(b.tenant, "ord_unsent"), "")
	require.NoError(t, err)
	require.Equal(t, "tenant "+b.tenant+" · order ord_unsent · 19.99 USD", decodeString(t, desc.RawResponse.GetExecutionConfig().GetUserMetadata().GetSummary()))
}

// enqueueOldShape is EnqueueTx as it was before migration 0012, statement
// for statement.
func enqueueOldShape(ctx context.Context, tx pgx.Tx, in orders.OrderInput) error {
	payload, err := json.Marshal(in)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `
INSERT INTO keyed_outbox (tenant_id, workflow_type, workflow_id, payload, amount_minor, currency, trace_context)
SELECT $1, $2, $3, $4, o.amount_minor, o.currency, $6
FROM (VALUES (1)) AS one
LEFT JOIN orders o ON o.tenant_id = $1 AND o.id = $5
ON CONFLICT (workflow_id) DO NOTHING`, in.TenantID, orders.WorkflowName, in.WorkflowID(), payload, in.OrderID, nil)
	return err
}

// firstInput returns the JSON input of workflowID's run, as its first
// history event holds it, and checks it was sent as JSON.
func firstInput(t *testing.T, c client.Client, workflowID string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	it := c.GetWorkflowHistory(ctx, workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	require.True(t, it.HasNext())
	event, err := it.Next()
	require.NoError(t, err)
	payloads := event.GetWorkflowExecutionStartedEventAttributes().GetInput().GetPayloads()
	require.Len(t, payloads, 1)
	require.Equal(t, "json/plain", string(payloads[0].GetMetadata()["encoding"]))
	return string(payloads[0].GetData())
}

// decodeString decodes a string payload, such as a run's static summary.
func decodeString(t *testing.T, p *commonpb.Payload) string {
	t.Helper()
	var s string
	require.NoError(t, converter.GetDefaultDataConverter().FromPayload(p, &s))
	return s
}

// requireOrderSearchAttributes checks the TenantID and OrderID search
// attributes of an order run.
func requireOrderSearchAttributes(t *testing.T, desc *workflowservice.DescribeWorkflowExecutionResponse, tenant, order string) {
	t.Helper()
	fields := desc.GetWorkflowExecutionInfo().GetSearchAttributes().GetIndexedFields()
	for name, want := range map[string]string{orders.SearchAttrTenantID: tenant, orders.SearchAttrOrderID: order} {
		var got string
		require.NoError(t, converter.GetDefaultDataConverter().FromPayload(fields[name], &got), name)
		require.Equal(t, want, got, name)
	}
}
