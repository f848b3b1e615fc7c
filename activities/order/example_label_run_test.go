package order_test

import (
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/internal/carrier"
	"github.com/keyedhq/keyed/internal/fakecarrier"
	"github.com/keyedhq/keyed/step"
)

// BuyLabel (docs/adding-an-activity.md) buys one label across a lost
// answer and a second run of a finished step.
func TestBuyLabelTwiceBuysOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fake := fakecarrier.New()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	c, err := carrier.New("ck_test", srv.URL, srv.Client())
	require.NoError(t, err)
	env := (&testsuite.WorkflowTestSuite{}).NewTestActivityEnvironment()
	require.NoError(t, step.Register(env, ordersteps.LabelDefinition(b.acts, c)))
	in := b.order(t, "label-1", "pm_card_visa")

	fake.FailNext = 1
	_, err = env.ExecuteActivity(ordersteps.DeclBuyLabel.Name, in)
	require.Error(t, err, "the answer is lost")
	for range 2 {
		val, err := env.ExecuteActivity(ordersteps.DeclBuyLabel.Name, in)
		require.NoError(t, err)
		var got ordersteps.LabelResult
		require.NoError(t, val.Get(&got))
		require.Equal(t, "lbl_1", got.LabelID)
	}
	require.Equal(t, 1, fake.Bought())
}
