package notify_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/notify"
)

// Short look-up windows keep these tests fast; the defaults are minutes. A
// send may be accepted up to testSendTimeout+testLag after its POST started.
const (
	testSendTimeout = time.Second
	testLag         = time.Second
	testGiveUp      = 500 * time.Millisecond
)

// policies runs f for each delivery policy of the "receipt" template.
func policies(t *testing.T, f func(t *testing.T, policy notify.Policy)) {
	for _, p := range []notify.Policy{notify.AtMostOnce, notify.AtLeastOnce} {
		t.Run(string(p), func(t *testing.T) {
			t.Parallel()
			f(t, p)
		})
	}
}

func lookupOpts(policy notify.Policy) *notify.SenderOpts {
	return &notify.SenderOpts{LookupLag: testLag, LookupGiveUp: testGiveUp,
		HTTPClient: &http.Client{Timeout: testSendTimeout},
		Policies:   map[string]notify.Policy{"receipt": policy}}
}

// sent returns the messages the fake accepted under m's key.
func (b *bundle) sent(m notify.Message) []fakesendgrid.Message {
	return b.fake.MessagesFor(notify.CustomArgEffectKey, m.Key.String())
}

// requireRecord checks m's effect record state and error code.
func (b *bundle) requireRecord(t *testing.T, m notify.Message, state effects.State, code string) *effects.Record {
	t.Helper()
	rec, err := b.claims.Get(context.Background(), m.Key)
	require.NoError(t, err)
	require.Equal(t, state, rec.State)
	require.Equal(t, code, rec.ErrorCode)
	return rec
}

// postedAndDied leaves m as an attempt that wrote its collapse-window row and
// then died, before or after its POST: a live claim of the same owner and
// the row dated now.
func postedAndDied(t *testing.T, b *bundle, m notify.Message) {
	t.Helper()
	crash(t, b, m)
	_, err := b.pool.Exec(context.Background(), `
INSERT INTO keyed_sends (tenant_id, recipient_sha256, template, entity, effect_key, sent_at)
VALUES ($1, $2, $3, $4, $5, now())`,
		m.Key.Tenant(), notify.RecipientDigest(m), m.Template, m.Entity, m.Key.String())
	require.NoError(t, err)
}

func TestLostResponseIsSettledFromSendGrid(t *testing.T) {
	t.Parallel()
	policies(t, func(t *testing.T, policy notify.Policy) {
		b := setup(t, lookupOpts(policy))
		ctx := context.Background()
		m := message("9f3a", "receipt")
		b.fake.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})

		// The first attempt cannot tell: transient, never ambiguous.
		_, err := b.sender.Send(ctx, m)
		require.True(t, effects.IsTransient(err), "got %v", err)
		require.ErrorIs(t, err, notify.ErrUnconfirmed)
		require.NotErrorIs(t, err, effects.ErrAmbiguous)
		b.requireRecord(t, m, effects.StateFailedTransient, notify.CodeUnconfirmed)

		// The retry finds the message at SendGrid and does not send.
		res, err := b.sender.Send(ctx, m)
		require.NoError(t, err)
		require.Len(t, b.sent(m), 1)
		require.Equal(t, b.sent(m)[0].MessageID, res.MessageID)
		rec := b.requireRecord(t, m, effects.StateSucceeded, "")
		require.JSONEq(t, `{"message_id":"`+res.MessageID+`"}`, string(rec.Result))
		require.Equal(t, 1, b.fake.Lookups())

		// A later repeat replays the record without asking SendGrid.
		again, err := b.sender.Send(ctx, m)
		require.NoError(t, err)
		require.Equal(t, res, again)
		require.Equal(t, 1, b.fake.Lookups())
		require.Len(t, b.sent(m), 1)

		// The window was never given back: another key for the same
		// message collapses.
		other, err := b.sender.Send(ctx, message("9f3a", "receipt-2"))
		require.NoError(t, err)
		require.True(t, other.Collapsed)
		require.Equal(t, 1, b.fake.Count())
	})
}

func TestLostResponseWaitsForTheIndex(t *testing.T) {
	t.Parallel()
	policies(t, func(t *testing.T, policy notify.Policy) {
		// SendGrid indexes the message after 1s; we wait up to 2s.
		b := setupWith(t, lookupOpts(policy), &fakesendgrid.Opts{IndexLag: testLag})
		ctx := context.Background()
		m := message("9f3a", "receipt")
		b.fake.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
		_, err := b.sender.Send(ctx, m)
		require.ErrorIs(t, err, notify.ErrUnconfirmed)

		_, err = b.sender.Send(ctx, m)
		require.True(t, effects.IsTransient(err), "got %v", err)
		require.ErrorIs(t, err, notify.ErrLookupPending)
		require.ErrorContains(t, err, "waiting for SendGrid's activity index")
		var le *notify.LookupError
		require.ErrorAs(t, err, &le)
		require.Equal(t, m.Key.String(), le.Key)
		require.Positive(t, le.Wait)
		b.requireRecord(t, m, effects.StateFailedTransient, notify.CodeLookupPending)

		res := retryUntilDone(t, b, m)
		require.Len(t, b.sent(m), 1)
		require.Equal(t, b.sent(m)[0].MessageID, res.MessageID)
	})
}

// retryUntilDone calls Send as Temporal would retry it, every 100ms while it
// fails transiently, and returns the outcome.
func retryUntilDone(t *testing.T, b *bundle, m notify.Message) notify.Result {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := b.sender.Send(context.Background(), m)
		if err == nil {
			return res
		}
		require.True(t, effects.IsTransient(err), "got %v", err)
		require.Less(t, time.Now(), deadline, "still failing: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
}

func TestReentryWithoutPostSendsOnce(t *testing.T) {
	t.Parallel()
	policies(t, func(t *testing.T, policy notify.Policy) {
		b := setup(t, lookupOpts(policy))
		m := message("9f3a", "receipt")
		// An earlier attempt claimed the key and died before its POST: no
		// collapse-window row. Even with the look-up down, that is known.
		crash(t, b, m)
		b.fake.SetLookupOutage(true)

		res, err := b.sender.Send(context.Background(), m)
		require.NoError(t, err)
		require.NotEmpty(t, res.MessageID)
		require.Len(t, b.sent(m), 1)
		require.Equal(t, 1, b.fake.Lookups())
	})
}

func TestReentryAfterPossiblePostWaitsOutTheLag(t *testing.T) {
	t.Parallel()
	policies(t, func(t *testing.T, policy notify.Policy) {
		b := setup(t, lookupOpts(policy))
		ctx := context.Background()
		m := message("9f3a", "receipt")
		// The earlier attempt wrote its row and died; its request never
		// reached SendGrid, which the look-up can only tell after the lag.
		// The window runs from the row's sent_at (the insert's now()),
		// which is after start but before a slow commit returns.
		start := time.Now()
		postedAndDied(t, b, m)

		_, err := b.sender.Send(ctx, m)
		require.ErrorIs(t, err, notify.ErrLookupPending)
		require.True(t, effects.IsTransient(err))
		require.Zero(t, b.fake.Count())

		res := retryUntilDone(t, b, m)
		require.GreaterOrEqual(t, time.Since(start), testSendTimeout+testLag, "sent only after the lag window")
		require.NotEmpty(t, res.MessageID)
		require.Len(t, b.sent(m), 1)
		require.Equal(t, m.Key.String(), b.sent(m)[0].Headers[notify.HeaderEffectKey])
	})
}

func TestTakeoverFindsTheMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, lookupOpts(notify.AtMostOnce))
	ctx := context.Background()
	m := message("9f3a", "receipt")
	// Another owner's attempt posted, lost the answer, claimed again and
	// died; its lease has run out.
	old := m
	old.Owner = "order:acme:9f3a:fulfil/receipt-old-run"
	b.fake.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
	_, err := b.sender.Send(ctx, old)
	require.ErrorIs(t, err, notify.ErrUnconfirmed)
	_, kind, _, fp := notify.ClaimParamsFor(m)
	_, err = b.claims.Claim(ctx, effects.ClaimParams{Key: m.Key, Kind: kind, Owner: old.Owner, Fingerprint: fp, Lease: 50 * time.Millisecond})
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)

	res, err := b.sender.Send(ctx, m)
	require.NoError(t, err)
	require.Equal(t, b.sent(m)[0].MessageID, res.MessageID)
	require.Len(t, b.sent(m), 1)
	require.Contains(t, b.logs.String(), "mode=takeover")
}

func TestLookupOutage(t *testing.T) {
	t.Parallel()

	t.Run("at most once gives up as ambiguous after the bound", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lookupOpts(notify.AtMostOnce))
		ctx := context.Background()
		m := message("9f3a", "receipt")
		postedAndDied(t, b, m)
		b.fake.SetLookupOutage(true)

		_, err := b.sender.Send(ctx, m)
		require.True(t, effects.IsTransient(err), "got %v", err)
		require.ErrorIs(t, err, notify.ErrLookupFailed)
		var le *notify.LookupError
		require.ErrorAs(t, err, &le)
		require.Equal(t, 503, le.Status)
		b.requireRecord(t, m, effects.StateFailedTransient, notify.CodeLookupFailed)

		time.Sleep(testSendTimeout + testLag + testGiveUp)
		_, err = b.sender.Send(ctx, m)
		require.ErrorIs(t, err, effects.ErrAmbiguous)
		require.False(t, effects.IsTransient(err))
		require.ErrorAs(t, err, &le)
		require.Equal(t, notify.CodeAmbiguous, le.Code())
		b.requireRecord(t, m, effects.StateFailedTerminal, notify.CodeAmbiguous)
		require.Zero(t, b.fake.Count())

		// Later attempts get the stored failure and ask nobody.
		lookups := b.fake.Lookups()
		_, err = b.sender.Send(ctx, m)
		require.ErrorIs(t, err, effects.ErrTerminal)
		require.Equal(t, lookups, b.fake.Lookups())
		require.NotContains(t, b.logs.String(), apiKey)
	})

	t.Run("an operator's retry sends though the look-up is down", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lookupOpts(notify.AtMostOnce))
		ctx := context.Background()
		m := message("9f3a", "receipt")
		postedAndDied(t, b, m) // its row says it may have posted; it did not
		b.fake.SetLookupOutage(true)
		time.Sleep(testSendTimeout + testLag + testGiveUp)
		_, err := b.sender.Send(ctx, m)
		require.ErrorIs(t, err, effects.ErrAmbiguous)

		// An operator checked SendGrid's dashboard: not sent.
		_, err = b.claims.Resolve(ctx, m.Key, effects.ResolveParams{Resolution: effects.ResolveRetry, Reason: "not in the dashboard"})
		require.NoError(t, err)
		res, err := b.sender.Send(ctx, m)
		require.NoError(t, err)
		require.NotEmpty(t, res.MessageID)
		require.Len(t, b.sent(m), 1)
		require.Contains(t, b.logs.String(), "an operator resolved the email as not sent; sending")
	})

	t.Run("an operator's retry does not resend what SendGrid shows", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lookupOpts(notify.AtMostOnce))
		ctx := context.Background()
		m := message("9f3a", "receipt")
		b.fake.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
		_, err := b.sender.Send(ctx, m)
		require.ErrorIs(t, err, notify.ErrUnconfirmed)
		b.fake.SetLookupOutage(true)
		time.Sleep(testSendTimeout + testLag + testGiveUp)
		_, err = b.sender.Send(ctx, m)
		require.ErrorIs(t, err, effects.ErrAmbiguous)

		// A mistaken retry, decided once the look-up is back: SendGrid's
		// record of the message wins.
		b.fake.SetLookupOutage(false)
		_, err = b.claims.Resolve(ctx, m.Key, effects.ResolveParams{Resolution: effects.ResolveRetry, Reason: "looked wrong"})
		require.NoError(t, err)
		res, err := b.sender.Send(ctx, m)
		require.NoError(t, err)
		require.Len(t, b.sent(m), 1)
		require.Equal(t, b.sent(m)[0].MessageID, res.MessageID)
	})

	t.Run("at least once sends after the bound", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lookupOpts(notify.AtLeastOnce))
		ctx := context.Background()
		m := message("9f3a", "receipt")
		postedAndDied(t, b, m)
		b.fake.SetLookupOutage(true)

		_, err := b.sender.Send(ctx, m)
		require.ErrorIs(t, err, notify.ErrLookupFailed)
		time.Sleep(testSendTimeout + testLag + testGiveUp)
		res, err := b.sender.Send(ctx, m)
		require.NoError(t, err)
		require.NotEmpty(t, res.MessageID)
		require.Len(t, b.sent(m), 1)
	})

	t.Run("a short outage only delays", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lookupOpts(notify.AtMostOnce))
		ctx := context.Background()
		m := message("9f3a", "receipt")
		b.fake.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
		_, err := b.sender.Send(ctx, m)
		require.ErrorIs(t, err, notify.ErrUnconfirmed)

		for _, kind := range []fakesendgrid.FaultKind{fakesendgrid.FaultServerError, fakesendgrid.FaultRateLimit} {
			b.fake.InjectLookup(fakesendgrid.Fault{Kind: kind})
			_, err = b.sender.Send(ctx, m)
			require.ErrorIs(t, err, notify.ErrLookupFailed, kind)
			require.True(t, effects.IsTransient(err))
		}
		res, err := b.sender.Send(ctx, m)
		require.NoError(t, err)
		require.Equal(t, b.sent(m)[0].MessageID, res.MessageID)
		require.Len(t, b.sent(m), 1)
	})

	t.Run("a key without Email Activity access is a failing look-up", func(t *testing.T) {
		t.Parallel()
		b := setupWith(t, lookupOpts(notify.AtMostOnce), &fakesendgrid.Opts{NoActivityAccess: true})
		m := message("9f3a", "receipt")
		postedAndDied(t, b, m)
		_, err := b.sender.Send(context.Background(), m)
		require.ErrorIs(t, err, notify.ErrLookupFailed)
		var le *notify.LookupError
		require.ErrorAs(t, err, &le)
		require.Equal(t, 403, le.Status)
		require.Contains(t, err.Error(), "access forbidden")
	})

	t.Run("an old claim without a row needs the look-up", func(t *testing.T) {
		t.Parallel()
		// The row may have aged out of a (short) window: no row no longer
		// proves that nothing was posted.
		b := setup(t, &notify.SenderOpts{CollapseWindow: 300 * time.Millisecond, LookupLag: 100 * time.Millisecond,
			LookupGiveUp: 100 * time.Millisecond, HTTPClient: &http.Client{Timeout: 200 * time.Millisecond}})
		m := message("9f3a", "receipt")
		crash(t, b, m)
		b.fake.SetLookupOutage(true)
		time.Sleep(450 * time.Millisecond)
		_, err := b.sender.Send(context.Background(), m)
		require.ErrorIs(t, err, effects.ErrAmbiguous)
		require.Zero(t, b.fake.Count())
	})
}

func TestTimeoutIsUnconfirmedThenSettled(t *testing.T) {
	t.Parallel()
	b := setup(t, lookupOpts(notify.AtMostOnce))
	m := message("9f3a", "receipt")
	// SendGrid accepts the message after the send timed out: within the
	// lag window that counts from the send timeout.
	b.fake.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultLatency, Delay: testSendTimeout + 200*time.Millisecond})
	_, err := b.sender.Send(context.Background(), m)
	require.ErrorIs(t, err, notify.ErrUnconfirmed)
	require.True(t, effects.IsTransient(err))

	res := retryUntilDone(t, b, m)
	require.Len(t, b.sent(m), 1)
	require.Equal(t, b.sent(m)[0].MessageID, res.MessageID)
}

func TestUnreachableReleasesTheWindow(t *testing.T) {
	t.Parallel()
	// A definite "not sent" (500) gives the window back; the retry finds
	// nothing at SendGrid and no row, so it sends at once.
	b := setup(t, lookupOpts(notify.AtMostOnce))
	ctx := context.Background()
	m := message("9f3a", "receipt")
	b.fake.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultServerError})
	_, err := b.sender.Send(ctx, m)
	require.ErrorIs(t, err, notify.ErrUnavailable)
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM keyed_sends`).Scan(&n))
	require.Zero(t, n)

	res, err := b.sender.Send(ctx, m)
	require.NoError(t, err)
	require.Equal(t, b.sent(m)[0].MessageID, res.MessageID)
	require.Len(t, b.sent(m), 1)
}

func TestActivityQuery(t *testing.T) {
	t.Parallel()
	require.Equal(t, `(unique_args['effect_key']="acme:order:9f3a:receipt")`,
		notify.ActivityQuery(effects.MustKey("acme", "order", "9f3a", "receipt")))
	require.Equal(t, `(unique_args['effect_key']="acme:a\"b\\c")`, notify.ActivityQuery(effects.MustKey("acme", `a"b\c`)))
}

func TestXMessageID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"v-iwGRqmdO9NFciFnhAUow.filter0001p1las1-16816-5A023E36-0.0":   "v-iwGRqmdO9NFciFnhAUow",
		"14c5d75ce93.dfd.64b469.filter0307p1las1-16816-5A023E36-1.0":   "14c5d75ce93.dfd.64b469",
		"v-iwGRqmdO9NFciFnhAUow":                                       "v-iwGRqmdO9NFciFnhAUow",
		"v-iwGRqmdO9NFciFnhAUow.recvd-5f5c7d8d77-kq2xz-1-6B0D5C81-3.0": "v-iwGRqmdO9NFciFnhAUow.recvd-5f5c7d8d77-kq2xz-1-6B0D5C81-3.0",
	} {
		require.Equal(t, want, notify.XMessageID(in), in)
	}
}

func TestCheckLookup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	require.NoError(t, b.sender.CheckLookup(ctx))
	require.Equal(t, 1, b.fake.Lookups())

	denied := setupWith(t, nil, &fakesendgrid.Opts{NoActivityAccess: true})
	err := denied.sender.CheckLookup(ctx)
	require.ErrorIs(t, err, notify.ErrLookupFailed)
	require.ErrorContains(t, err, "status 403")
	require.NotContains(t, err.Error(), apiKey)

	denied.fake.SetLookupOutage(true)
	require.ErrorContains(t, denied.sender.CheckLookup(ctx), "status 503")
}

// Confirm tells an operator's "done" apart: the message SendGrid shows
// under the key is confirmed; another ID, or none once the index had the
// lag window, is not sent; none within it is pending; a failing look-up
// (an outage, a key without the Email Activity add-on) is a failure that
// says so.
func TestConfirmChecksTheMessageUnderTheKey(t *testing.T) {
	t.Parallel()
	b := setupWith(t, lookupOpts(notify.AtMostOnce), &fakesendgrid.Opts{IndexLag: 300 * time.Millisecond})
	ctx := context.Background()
	m := message("c1", "receipt")
	res, err := b.sender.Send(ctx, m)
	require.NoError(t, err)

	// Accepted now: SendGrid's index does not show it yet, and the record
	// changed less than the lag ago.
	err = b.sender.Confirm(ctx, m.Key, res.MessageID)
	require.ErrorIs(t, err, notify.ErrLookupPending)
	require.ErrorContains(t, err, "ask again in")
	require.Eventually(t, func() bool { return b.sender.Confirm(ctx, m.Key, res.MessageID) == nil }, 5*time.Second, 50*time.Millisecond)
	require.NoError(t, b.sender.Confirm(ctx, m.Key, res.MessageID+".filter0001p1las1-16816-5A023E36-0.0"), "the feed's msg_id names it too")

	err = b.sender.Confirm(ctx, m.Key, "fake-id")
	require.ErrorIs(t, err, notify.ErrLookupPending, "another ID within the lag may still be indexed")
	time.Sleep(testSendTimeout + testLag)
	err = b.sender.Confirm(ctx, m.Key, "fake-id")
	require.ErrorIs(t, err, notify.ErrNotSent)
	require.ErrorContains(t, err, "shows only "+res.MessageID+" under acme:order:c1:receipt, not fake-id")
	err = b.sender.Confirm(ctx, effects.MustKey("acme", "order", "none", "receipt"), res.MessageID)
	require.ErrorIs(t, err, notify.ErrNotSent, "no record: the index is long settled")
	require.ErrorContains(t, err, "shows no message under acme:order:none:receipt")

	b.fake.SetLookupOutage(true)
	err = b.sender.Confirm(ctx, m.Key, res.MessageID)
	require.ErrorIs(t, err, notify.ErrLookupFailed)
	require.ErrorContains(t, err, "status 503")
	require.NotContains(t, err.Error(), apiKey)

	noAddOn := setupWith(t, lookupOpts(notify.AtMostOnce), &fakesendgrid.Opts{NoActivityAccess: true})
	err = noAddOn.sender.Confirm(ctx, m.Key, res.MessageID)
	require.ErrorIs(t, err, notify.ErrLookupFailed)
	require.ErrorContains(t, err, "status 403")
	require.ErrorContains(t, err, "the Email Activity add-on")
}

// Find, for the settler, never calls a message absent while SendGrid's
// index may still lag: a message accepted but not indexed yet is pending,
// then found; a key with nothing under it is absent only after the lag; a
// look-up that fails is a failure, without the API key.
func TestFindNeverCallsAbsentInsideTheLag(t *testing.T) {
	t.Parallel()
	b := setupWith(t, lookupOpts(notify.AtMostOnce), &fakesendgrid.Opts{IndexLag: 300 * time.Millisecond})
	ctx := context.Background()
	m := message("f1", "receipt")
	res, err := b.sender.Send(ctx, m)
	require.NoError(t, err)

	_, err = b.sender.Find(ctx, m.Key)
	require.ErrorIs(t, err, notify.ErrLookupPending, "accepted, not indexed yet: the look-up lies by omission")
	require.Eventually(t, func() bool {
		id, err := b.sender.Find(ctx, m.Key)
		return err == nil && id == res.MessageID
	}, 5*time.Second, 50*time.Millisecond)

	empty := message("f2", "receipt")
	claim, err := b.claims.Claim(ctx, effects.ClaimParams{Key: empty.Key, Kind: "receipt", Owner: "test"})
	require.NoError(t, err)
	require.NoError(t, b.claims.Fail(ctx, claim, effects.Transient(errors.New("never posted"))))
	_, err = b.sender.Find(ctx, empty.Key)
	require.ErrorIs(t, err, notify.ErrLookupPending, "nothing yet, but the record changed inside the lag")
	time.Sleep(testSendTimeout + testLag)
	_, err = b.sender.Find(ctx, empty.Key)
	require.ErrorIs(t, err, notify.ErrNotSent, "nothing after the lag: absent")

	b.fake.SetLookupOutage(true)
	_, err = b.sender.Find(ctx, m.Key)
	require.ErrorIs(t, err, notify.ErrLookupFailed)
	require.NotContains(t, err.Error(), apiKey)
}
