package refund_test

import (
	"strings"
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

// Every order that validates can be refunded: with the longest order ID
// its tenant allows, a refund ID of the most bytes has a key for every
// declared refund step (orders.RefundKeyRoom holds them all).
func TestEveryOrderThatValidatesCanBeRefunded(t *testing.T) {
	t.Parallel()
	for _, tenantLen := range []int{4, 80, 120, 150} {
		tenant := strings.Repeat("t", tenantLen)
		id := ""
		for n := orders.MaxIDBytes; n > 0 && id == ""; n-- {
			o := orders.NewOrder{TenantID: tenant, ID: strings.Repeat("o", n), AmountMinor: 1, Currency: "eur",
				CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"}
			if o.Validate() == nil {
				id = o.ID
			}
		}
		require.NotEmpty(t, id, "tenant of %d bytes", tenantLen)
		in := refunds.NewInput(tenant, id, strings.Repeat("r", orders.MaxIDBytes), 1, "")
		require.NoError(t, in.Validate(), "tenant of %d bytes", tenantLen)
		for _, d := range refundflow.Pipeline().Steps {
			_, err := in.EffectKey(d.Step)
			require.NoError(t, err, "tenant of %d bytes, step %s", tenantLen, d.Step)
		}
	}
}
