package workflows_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/workflows"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// The relay's dispatch (pipeline.Configure over the registered pipelines):
// a refund run started from the outbox gets its order's search attributes
// and a summary with its amount; a refund row that does not decode is
// refused for good.
func TestConfigureOutboxStartGivesRefundsASummary(t *testing.T) {
	t.Parallel()
	configure := pipeline.Configure(workflows.Pipelines(), nil)
	req, err := refunds.StartRequest(refunds.NewInput("acme", "9f3a", "r1", 500, "damaged"), "usd")
	require.NoError(t, err)
	var o client.StartWorkflowOptions
	require.NoError(t, configure(context.Background(), req, &o))
	require.Equal(t, "refund r1 of order 9f3a · 5.00 USD", o.StaticSummary)
	tenant, ok := o.TypedSearchAttributes.GetKeyword(pipeline.SearchAttrTenantID)
	require.True(t, ok)
	require.Equal(t, "acme", tenant)
	order, ok := o.TypedSearchAttributes.GetKeyword(temporal.NewSearchAttributeKeyKeyword(orders.SearchAttrOrderID))
	require.True(t, ok)
	require.Equal(t, "9f3a", order)
	require.Equal(t, "acme", o.Priority.FairnessKey, "the tenant is the run's fairness key")
	require.Contains(t, o.Memo, pipeline.MemoLocalSteps)

	req.Meta = nil
	o = client.StartWorkflowOptions{}
	require.NoError(t, configure(context.Background(), req, &o))
	require.Equal(t, "refund r1 of order 9f3a", o.StaticSummary, "without the currency, no amount")

	req.Payload = []byte(`{"v":1,"tenant_id":"acme","order_id":"9f3a","refund_id":"r1","amount_minor":0}`)
	require.ErrorIs(t, configure(context.Background(), req, &o), outbox.ErrInvalid)

	// Other workflow types still pass through untouched.
	o = client.StartWorkflowOptions{}
	require.NoError(t, configure(context.Background(), outbox.Request{WorkflowType: "InvoiceWorkflow", WorkflowID: "i", Payload: []byte(`{}`)}, &o))
	require.Empty(t, o.StaticSummary)
}

// An order run started from the outbox (by the relay, or by the API's
// Update-with-Start) carries what orderflow.StartOptions gives a run
// started directly: its search attributes, its summary, the tenant's
// fairness key, and the local-steps memo.
func TestConfigureOutboxStartGivesOrdersTheirStartOptions(t *testing.T) {
	t.Parallel()
	configure := pipeline.Configure(workflows.Pipelines(), nil)
	in := orders.NewOrderInput("acme", "9f3a")
	req, err := orders.StartRequest(in, nil)
	require.NoError(t, err)
	var o client.StartWorkflowOptions
	require.NoError(t, configure(context.Background(), req, &o))
	direct, err := orderflow.StartOptions(in, nil)
	require.NoError(t, err)
	require.Equal(t, direct.StaticSummary, o.StaticSummary)
	require.Equal(t, direct.TypedSearchAttributes, o.TypedSearchAttributes)
	require.Equal(t, direct.Priority, o.Priority)
	require.Equal(t, "acme", o.Priority.FairnessKey)
	require.Equal(t, map[string]any{pipeline.MemoLocalSteps: true, pipeline.MemoLocalFirst: true}, o.Memo)
}
