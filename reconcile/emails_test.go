package reconcile_test

import (
	"bytes"
	"encoding/json"
	"errors"
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

// mailOutsideKeyed posts a message carrying key's custom argument straight
// to the fake SendGrid, as a second sender or a bug would.
func mailOutsideKeyed(t *testing.T, url string, key effects.Key) {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"personalizations": []map[string]any{{"to": []map[string]string{{"email": "ann@example.com"}}}},
		"from":             map[string]string{"email": "shop@example.com"}, "subject": "s",
		"content":     []map[string]string{{"type": "text/plain", "value": "t"}},
		"custom_args": map[string]string{notify.CustomArgEffectKey: key.String()},
	})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, url+"/v3/mail/send", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer SG.reconcile")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
}

// The reconciliation looks every send's key up at SendGrid: a receipt sent
// once and recorded is clean; one SendGrid holds twice is a duplicate; a
// message under a send whose record failed is unrecorded; a recorded
// message SendGrid never sent is missing, once the index has had its lag;
// while the look-up is down, every key waits, in flight.
func TestEmailRecordsAreReconciledWithSendGrid(t *testing.T) {
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
	send := func(id string) effects.Key {
		key := effects.MustKey("acme", "order", id, orders.StepReceipt)
		_, err := sender.Send(b.ctx, notify.Message{Template: orders.StepReceipt, To: "ann@example.com", Subject: "s", Text: "t",
			Key: key, Entity: id, Owner: "test"})
		require.NoError(t, err)
		return key
	}
	claim := func(id string) (effects.Key, *effects.Claim) {
		key := effects.MustKey("acme", "order", id, orders.StepReceipt)
		c, err := b.claims.Claim(b.ctx, effects.ClaimParams{Key: key, Kind: orders.StepReceipt, Owner: "test"})
		require.NoError(t, err)
		return key, c
	}

	send("clean")
	twice := send("twice")
	mailOutsideKeyed(t, srv.URL, twice)
	unrecorded, c := claim("unrecorded")
	require.NoError(t, b.claims.Fail(b.ctx, c, errors.New("gave up")))
	mailOutsideKeyed(t, srv.URL, unrecorded)
	ghost, c := claim("ghost")
	require.NoError(t, b.claims.Complete(b.ctx, c, orders.ReceiptResult{MessageID: "msg-never-sent"}))
	time.Sleep(1100 * time.Millisecond) // Past the index lag (the send timeout plus LookupLag).

	w := reconcile.Window{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)}
	rep, err := rec.Run(b.ctx, w)
	require.NoError(t, err)
	require.Equal(t, 4, rep.Emails)
	got := map[string]reconcile.Kind{}
	for _, f := range rep.Findings {
		got[f.EffectKey] = f.Kind
	}
	require.Equal(t, map[string]reconcile.Kind{twice.String(): reconcile.KindDuplicateEmails,
		unrecorded.String(): reconcile.KindUnrecordedEmail, ghost.String(): reconcile.KindEmailMissingAtProvider}, got)

	mail.SetLookupOutage(true)
	rep, err = rec.Run(b.ctx, w)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "SendGrid cannot be asked: nothing is reported")
	require.Equal(t, 4, rep.InFlight)
}
