package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// runOfKey finds the run of an order's and a refund's step from the key
// alone, as each pipeline derives its workflow ID.
func TestRunOfKeyMapsOrderAndRefundKeys(t *testing.T) {
	t.Parallel()
	order := orders.NewOrderInput("acme", "9f3a")
	refund := refunds.NewInput("acme", "9f3a", "r1", 500, "")
	cases := []struct {
		key       string
		id, step  string
		recognise bool
	}{
		{"acme:order:9f3a:receipt", order.WorkflowID(), orders.StepReceipt, true},
		{"acme:order:9f3a:refund:r1:refund_email", refund.WorkflowID(), refunds.StepEmail, true},
		{"acme:order:9f3a:refund:r1:refund_stripe", refund.WorkflowID(), refunds.StepStripe, true},
		{"acme:order:9f3a", "", "", false},
		{"acme:order:9f3a:refund:r1", "", "", false},
		{"acme:shipment:s1:label", "", "", false},
		{"acme:order:9f3a:other:r1:refund_email", "", "", false},
	}
	for _, c := range cases {
		k, err := effects.ParseKey(c.key)
		require.NoError(t, err, c.key)
		id, step, ok := runOfKey(k)
		require.Equal(t, c.recognise, ok, c.key)
		require.Equal(t, c.id, id, c.key)
		require.Equal(t, c.step, step, c.key)
	}
	require.Equal(t, "order:acme:9f3a:fulfil", order.WorkflowID())
	require.Equal(t, "refund:acme:9f3a:r1", refund.WorkflowID())
}
