package reconcile_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/reconcile"
)

// A receipt record whose message SendGrid shows under its key is clean; one
// holding a message ID SendGrid never sent under it is reported once the
// index has had its lag; while the look-up is down the check waits, in
// flight.
func TestEmailRecordsAreCheckedWithSendGrid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mail := fakesendgrid.New(nil)
	srv := httptest.NewServer(mail)
	t.Cleanup(srv.Close)
	sender, err := notify.NewSender(b.claims, b.pool, &notify.SenderOpts{APIKey: "SG.reconcile", BaseURL: srv.URL,
		From: "shop@example.com", HTTPClient: &http.Client{Timeout: time.Second}, LookupLag: time.Millisecond})
	require.NoError(t, err)
	rec, err := reconcile.New(b.claims, b.pool, b.stripe, &reconcile.Opts{Sender: sender})
	require.NoError(t, err)

	sent := effects.MustKey("acme", "order", "e1", orders.StepReceipt)
	_, err = sender.Send(b.ctx, notify.Message{Template: orders.StepReceipt, To: "ann@example.com", Subject: "s", Text: "t",
		Key: sent, Entity: "e1", Owner: "test"})
	require.NoError(t, err)
	ghost := effects.MustKey("acme", "order", "e2", orders.StepReceipt)
	claim, err := b.claims.Claim(b.ctx, effects.ClaimParams{Key: ghost, Kind: orders.StepReceipt, Owner: "test"})
	require.NoError(t, err)
	require.NoError(t, b.claims.Complete(b.ctx, claim, orders.ReceiptResult{MessageID: "msg-never-sent"}))
	time.Sleep(1100 * time.Millisecond) // Past the index lag (the send timeout plus LookupLag).

	w := reconcile.Window{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)}
	rep, err := rec.Run(b.ctx, w)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Emails)
	require.Len(t, rep.Findings, 1)
	require.Equal(t, reconcile.KindEmailMissingAtProvider, rep.Findings[0].Kind)
	require.Equal(t, ghost.String(), rep.Findings[0].EffectKey)
	require.Contains(t, rep.Findings[0].Detail, "msg-never-sent")

	mail.SetLookupOutage(true)
	rep, err = rec.Run(b.ctx, w)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "SendGrid cannot be asked: nothing is reported")
	require.Equal(t, 2, rep.InFlight)
}
