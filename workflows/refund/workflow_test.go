package refund_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	refundflow "github.com/keyedhq/keyed/workflows/refund"
)

// Every start of a refund finds its order's runs' search attributes and a
// summary naming the refund, so that the Web UI's search for an order
// lists its refunds too.
func TestStartOptionsCarryTheOrdersSearchAttributes(t *testing.T) {
	t.Parallel()
	o := refundflow.StartOptions(refunds.NewInput("acme", "9f3a", "r1", 500, ""), "q")
	require.Equal(t, "refund:acme:9f3a:r1", o.ID)
	require.Equal(t, "q", o.TaskQueue)
	require.Equal(t, "refund r1 of order 9f3a", o.StaticSummary)
	for name, want := range map[string]string{orders.SearchAttrTenantID: "acme", orders.SearchAttrOrderID: "9f3a"} {
		got, ok := o.TypedSearchAttributes.GetKeyword(temporal.NewSearchAttributeKeyKeyword(name))
		require.True(t, ok, name)
		require.Equal(t, want, got, name)
	}
}
