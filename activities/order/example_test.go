package order_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	ordersteps "github.com/keyedhq/keyed/activities/order"
)

// The second-run tests of the example activities
// (docs/adding-an-activity.md).

func TestSendSurveyTwiceSendsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.secondRun(t, ordersteps.DeclSendSurvey.Name, b.order(t, "survey-1", "pm_card_visa"))
	require.Equal(t, 1, b.sendgrid.Count())
}

func TestSendThanksTwiceSendsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.secondRun(t, ordersteps.DeclSendThanks.Name, b.order(t, "thanks-1", "pm_card_visa"))
	require.Equal(t, 1, b.sendgrid.Count())
}
