package step_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/slotshare"
	"github.com/keyedhq/keyed/step"
)

// requireNotLocal fails unless err is the gate's benign, retryable refusal.
func requireNotLocal(t *testing.T, err error) {
	t.Helper()
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, step.ErrTypeNotLocal, app.Type())
	require.False(t, app.NonRetryable())
	require.Equal(t, temporal.ApplicationErrorCategoryBenign, app.Category())
	require.NotContains(t, step.NonRetryableErrorTypes(), app.Type())
}

// TestLocalGate: a first attempt of a bounded provider is refused, and so
// is one over the worker's slots or over its tenant's share; a nil gate
// admits all.
func TestLocalGate(t *testing.T) {
	t.Parallel()
	var none *step.LocalGate
	release, err := none.Admit("stripe", "acme")
	require.NoError(t, err)
	release()

	g, err := step.NewLocalGate(3, 2, []string{"sendgrid"})
	require.NoError(t, err)
	_, err = g.Admit("sendgrid", "acme")
	requireNotLocal(t, err)

	a1, err := g.Admit("stripe", "acme")
	require.NoError(t, err)
	a2, err := g.Admit("stripe", "acme")
	require.NoError(t, err)
	_, err = g.Admit("stripe", "acme")
	requireNotLocal(t, err) // acme's share is 2
	b1, err := g.Admit("stripe", "globex")
	require.NoError(t, err)
	_, err = g.Admit("stripe", "initech")
	requireNotLocal(t, err) // the worker's 3 are taken
	a1()
	c1, err := g.Admit("stripe", "initech")
	require.NoError(t, err)
	for _, r := range []func(){a2, b1, c1} {
		r()
	}

	require.EqualValues(t, 3, g.Refused())

	_, err = step.NewLocalGate(0, 0, nil)
	require.ErrorIs(t, err, slotshare.ErrInvalidOpts)
	_, err = step.NewLocalGate(2, 3, nil)
	require.ErrorIs(t, err, slotshare.ErrInvalidOpts)
}

// TestFirstAttemptOptions: one attempt, bounded by FirstAttemptTimeout or
// the step's own shorter start-to-close, with the step's summary.
func TestFirstAttemptOptions(t *testing.T) {
	t.Parallel()
	d := step.Declaration{Name: "BuyLabel", Class: effects.ClassExternalCreate, Step: "label"}
	o := d.FirstAttemptOptions("acme:shipment:s1:label")
	require.Equal(t, step.FirstAttemptTimeout, o.StartToCloseTimeout)
	require.Equal(t, step.FirstAttemptTimeout, o.ScheduleToCloseTimeout)
	require.EqualValues(t, 1, o.RetryPolicy.MaximumAttempts)
	require.Equal(t, d.ActivityOptions("acme:shipment:s1:label").Summary, o.Summary)

	d.Options.StartToClose = time.Second
	require.Equal(t, time.Second, d.FirstAttemptOptions("k").StartToCloseTimeout)
}
