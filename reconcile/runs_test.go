package reconcile_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/reconcile"
)

func TestASuccessfulRunIsRecordedAndAFailedOneIsNot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := reconcile.Last(b.ctx, b.pool)
	require.ErrorIs(t, err, reconcile.ErrNeverRan)

	// A run that fails at Stripe records nothing.
	srv := httptest.NewServer(fakestripe.New(&fakestripe.Opts{APIKey: "sk_test_other"}))
	t.Cleanup(srv.Close)
	sc, err := stripestep.NewClient("sk_test_wrong", srv.URL, srv.Client())
	require.NoError(t, err)
	failing, err := reconcile.New(b.claims, b.pool, sc, nil)
	require.NoError(t, err)
	_, err = failing.Run(b.ctx, b.window)
	require.Error(t, err)
	_, err = reconcile.Last(b.ctx, b.pool)
	require.ErrorIs(t, err, reconcile.ErrNeverRan)

	b.charge(t, "acme:order:1:charge", 1999, from.Add(time.Hour))
	b.pi(t, "acme:order:2:charge", "acme:order:2:charge", 500, "pm_card_visa", from.Add(2*time.Hour)) // missing_record
	before := time.Now()
	rep := b.run(t)
	last, err := reconcile.Last(b.ctx, b.pool)
	require.NoError(t, err)
	require.True(t, last.Window.From.Equal(b.window.From) && last.Window.To.Equal(b.window.To), "%+v", last.Window)
	require.Equal(t, rep.Records, last.Records)
	require.Equal(t, rep.PaymentIntents, last.PaymentIntents)
	require.Equal(t, 1, last.Findings)
	require.WithinRange(t, last.FinishedAt, before.Add(-time.Minute), time.Now().Add(time.Minute))
}
