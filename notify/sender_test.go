package notify_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/internal/logbuf"
	"github.com/keyedhq/keyed/notify"
)

const (
	apiKey    = "SG.test-key-never-logged"
	recipient = "ada@example.com"
	body      = "Thank you for order 9f3a. This body is never stored."
)

var tables = []string{"keyed_effects", "keyed_sends"}

type bundle struct {
	pool   *pgxpool.Pool
	claims *effects.Client
	fake   *fakesendgrid.Server
	url    string
	sender *notify.Sender
	logs   *logbuf.Buffer
}

func setup(t testing.TB, opts *notify.SenderOpts) *bundle {
	t.Helper()
	return setupWith(t, opts, nil)
}

// setupWith is setup with options for the fake SendGrid.
func setupWith(t testing.TB, opts *notify.SenderOpts, fakeOpts *fakesendgrid.Opts) *bundle {
	t.Helper()
	b := &bundle{pool: dbtest.NewPool(t), fake: fakesendgrid.New(fakeOpts), logs: &logbuf.Buffer{}}
	logger := slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b.claims = effectstest.NewClient(t, b.pool, &effects.ClientOpts{Logger: logger})
	ts := httptest.NewServer(b.fake)
	t.Cleanup(ts.Close)
	b.url = ts.URL
	if opts == nil {
		opts = &notify.SenderOpts{}
	}
	if opts.APIKey == "" {
		opts.APIKey = apiKey
	}
	if opts.From == "" {
		opts.From = "Keyed Shop <receipts@example.com>"
	}
	if opts.BaseURL == "" {
		opts.BaseURL = ts.URL
	}
	opts.Logger = logger
	s, err := notify.NewSender(b.claims, b.pool, opts)
	require.NoError(t, err)
	b.sender = s
	return b
}

func message(order, step string) notify.Message {
	return notify.Message{
		Template: "receipt",
		To:       recipient,
		Subject:  "Your receipt for order " + order,
		Text:     body,
		Key:      effects.MustKey("acme", "order", order, step),
		Entity:   order,
		Owner:    "order:acme:" + order + ":fulfil/" + step,
	}
}

func TestSendTwiceSendsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	m := message("9f3a", "receipt")

	var results []notify.Result
	effectstest.SecondRun(t, b.pool, tables, func(ctx context.Context) error {
		res, err := b.sender.Send(ctx, m)
		results = append(results, res)
		return err
	})
	require.Equal(t, 1, b.fake.Count())
	require.Equal(t, results[0], results[1])
	require.NotEmpty(t, results[0].MessageID)
	require.False(t, results[0].Collapsed)

	sent := b.fake.MessagesFor(notify.CustomArgEffectKey, m.Key.String())
	require.Len(t, sent, 1)
	require.Equal(t, []string{recipient}, sent[0].To)
	require.Equal(t, "receipts@example.com", sent[0].From)
	require.Equal(t, m.Subject, sent[0].Subject)
	require.Equal(t, body, sent[0].Body)
	require.Equal(t, m.Key.String(), sent[0].Headers[notify.HeaderEffectKey])
	require.Equal(t, results[0].MessageID, sent[0].MessageID)

	// Only the outcome is stored: no address, no body.
	rec, err := b.claims.Get(context.Background(), m.Key)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.Equal(t, "receipt", rec.Kind)
	require.JSONEq(t, `{"message_id":"`+results[0].MessageID+`"}`, string(rec.Result))
	snap := effectstest.Snapshot(t, b.pool, tables...)
	for _, rows := range snap {
		for _, row := range rows {
			require.NotContains(t, row, recipient)
			require.NotContains(t, row, "never stored")
		}
	}
	require.Len(t, snap["keyed_sends"], 1)

	// Neither the API key, the address nor the body is logged.
	logs := b.logs.String()
	require.Contains(t, logs, m.Key.String())
	require.NotContains(t, logs, apiKey)
	require.NotContains(t, logs, recipient)
	require.NotContains(t, logs, "never stored")
}

func TestCollapseWindowDropsRepeatOfAnotherKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()

	first, err := b.sender.Send(ctx, message("9f3a", "receipt"))
	require.NoError(t, err)
	require.False(t, first.Collapsed)

	// Same recipient, template and entity under another key (say, a
	// producer that sent the event twice): dropped, and the effect is done.
	repeat := message("9f3a", "receipt")
	repeat.Key = effects.MustKey("acme", "order", "9f3a", "receipt-again")
	res, err := b.sender.Send(ctx, repeat)
	require.NoError(t, err)
	require.Equal(t, notify.Result{Collapsed: true}, res)
	require.Equal(t, 1, b.fake.Count())
	rec, err := b.claims.Get(ctx, repeat.Key)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.JSONEq(t, `{"collapsed":true}`, string(rec.Result))

	// The recipient is compared without case.
	upper := message("9f3a", "receipt-upper")
	upper.To = strings.ToUpper(recipient[:1]) + recipient[1:]
	res, err = b.sender.Send(ctx, upper)
	require.NoError(t, err)
	require.True(t, res.Collapsed)

	// Another entity or another template is not a repeat.
	other := message("77aa", "receipt")
	res, err = b.sender.Send(ctx, other)
	require.NoError(t, err)
	require.False(t, res.Collapsed)
	shipped := message("9f3a", "shipped")
	shipped.Template = "shipped"
	res, err = b.sender.Send(ctx, shipped)
	require.NoError(t, err)
	require.False(t, res.Collapsed)
	require.Equal(t, 3, b.fake.Count())

	// Once the window has passed, the same message goes out again.
	_, err = b.pool.Exec(ctx, `UPDATE keyed_sends SET sent_at = sent_at - interval '11 minutes'`)
	require.NoError(t, err)
	late := message("9f3a", "receipt-late")
	res, err = b.sender.Send(ctx, late)
	require.NoError(t, err)
	require.False(t, res.Collapsed)
	require.Equal(t, 4, b.fake.Count())

	n, err := b.sender.Prune(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n) // 77aa and shipped, both "11 minutes" old.
}

func TestCollapseWindowIsConfigurable(t *testing.T) {
	t.Parallel()
	b := setup(t, &notify.SenderOpts{CollapseWindow: time.Second, LookupLag: 100 * time.Millisecond,
		HTTPClient: &http.Client{Timeout: 900 * time.Millisecond}})
	ctx := context.Background()
	_, err := b.sender.Send(ctx, message("9f3a", "receipt"))
	require.NoError(t, err)
	res, err := b.sender.Send(ctx, message("9f3a", "receipt-2"))
	require.NoError(t, err)
	require.True(t, res.Collapsed)
	time.Sleep(1100 * time.Millisecond)
	res, err = b.sender.Send(ctx, message("9f3a", "receipt-3"))
	require.NoError(t, err)
	require.False(t, res.Collapsed)
	require.Equal(t, 2, b.fake.Count())
}

// crash leaves m's claim behind as an attempt that died after claiming
// would: claimed, lease live, same owner.
func crash(t testing.TB, b *bundle, m notify.Message) {
	t.Helper()
	_, kind, owner, fp := notify.ClaimParamsFor(m)
	_, err := b.claims.Claim(context.Background(), effects.ClaimParams{Key: m.Key, Kind: kind, Owner: owner, Fingerprint: fp})
	require.NoError(t, err)
}

func TestServerErrorsAreTransient(t *testing.T) {
	t.Parallel()
	for _, kind := range []fakesendgrid.FaultKind{fakesendgrid.FaultServerError, fakesendgrid.FaultRateLimit} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			ctx := context.Background()
			m := message("9f3a", "receipt")
			b.fake.Inject(fakesendgrid.Fault{Kind: kind})

			_, err := b.sender.Send(ctx, m)
			require.True(t, effects.IsTransient(err), "got %v", err)
			require.ErrorIs(t, err, notify.ErrUnavailable)
			var se *notify.SendError
			require.ErrorAs(t, err, &se)
			require.Contains(t, []int{429, 500}, se.Status)
			require.Zero(t, b.fake.Count())
			rec, err := b.claims.Get(ctx, m.Key)
			require.NoError(t, err)
			require.Equal(t, effects.StateFailedTransient, rec.State)
			require.Equal(t, notify.CodeUnavailable, rec.ErrorCode)

			// Nothing went out, so the window was given back: another key
			// for the same message is not dropped...
			other := message("9f3a", "receipt-other")
			res, err := b.sender.Send(ctx, other)
			require.NoError(t, err)
			require.False(t, res.Collapsed)

			// ...and the retry of the first (even at most once) sends,
			// or here collapses into the one that just went out.
			res, err = b.sender.Send(ctx, m)
			require.NoError(t, err)
			require.True(t, res.Collapsed)
			require.Equal(t, 1, b.fake.Count())
		})
	}
}

func TestTransientThenRetrySends(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	m := message("9f3a", "receipt")
	b.fake.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultServerError, Times: 2})

	for range 2 {
		_, err := b.sender.Send(ctx, m)
		require.True(t, effects.IsTransient(err), "got %v", err)
	}
	res, err := b.sender.Send(ctx, m)
	require.NoError(t, err)
	require.NotEmpty(t, res.MessageID)
	require.Equal(t, 1, b.fake.Count())
	rec, err := b.claims.Get(ctx, m.Key)
	require.NoError(t, err)
	require.Equal(t, 3, rec.Attempts)
}

func TestRejectedIsTerminal(t *testing.T) {
	t.Parallel()
	b := setupWith(t, &notify.SenderOpts{APIKey: "SG.revoked"}, &fakesendgrid.Opts{APIKey: "SG.current"})
	ctx := context.Background()
	m := message("9f3a", "receipt")

	_, err := b.sender.Send(ctx, m)
	require.ErrorIs(t, err, notify.ErrRejected)
	require.False(t, effects.IsTransient(err))
	var se *notify.SendError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 401, se.Status)
	require.Equal(t, notify.CodeRejected, se.Code())
	require.NotContains(t, err.Error(), "SG.revoked")

	_, err = b.sender.Send(ctx, m)
	require.ErrorIs(t, err, effects.ErrTerminal)
	require.Zero(t, b.fake.Count())
	require.NotContains(t, b.logs.String(), "SG.revoked")
}

func TestUnreachableIsTransientEvenAtMostOnce(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	b := setup(t, &notify.SenderOpts{BaseURL: "http://" + addr})

	_, err = b.sender.Send(context.Background(), message("9f3a", "receipt"))
	require.True(t, effects.IsTransient(err), "got %v", err)
	require.ErrorIs(t, err, notify.ErrUnavailable)
}

func TestKeyReusedForAnotherRecipient(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	m := message("9f3a", "receipt")
	_, err := b.sender.Send(ctx, m)
	require.NoError(t, err)
	m.To = "grace@example.com"
	_, err = b.sender.Send(ctx, m)
	require.ErrorIs(t, err, effects.ErrKeyReused)
	require.Equal(t, 1, b.fake.Count())
}

func TestInvalidMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for name, mutate := range map[string]func(*notify.Message){
		"template": func(m *notify.Message) { m.Template = "" },
		"to":       func(m *notify.Message) { m.To = "Ada <ada@example.com>" },
		"subject":  func(m *notify.Message) { m.Subject = "" },
		"text":     func(m *notify.Message) { m.Text = "" },
		"key":      func(m *notify.Message) { m.Key = effects.Key{} },
		"entity":   func(m *notify.Message) { m.Entity = "" },
		"owner":    func(m *notify.Message) { m.Owner = "" },
	} {
		m := message("9f3a", "receipt")
		mutate(&m)
		_, err := b.sender.Send(context.Background(), m)
		require.ErrorIs(t, err, notify.ErrInvalidMessage, name)
		require.Contains(t, err.Error(), name)
	}
	require.Zero(t, b.fake.Requests())
}

func TestNewSenderValidates(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	claims := effectstest.NewClient(t, pool, nil)
	ok := notify.SenderOpts{APIKey: apiKey, From: "receipts@example.com"}

	s, err := notify.NewSender(claims, pool, &ok)
	require.NoError(t, err)
	require.NotNil(t, s)

	for name, tc := range map[string]struct {
		claims *effects.Client
		db     effects.DB
		mutate func(*notify.SenderOpts)
		want   string
	}{
		"nil claims":   {db: pool, mutate: func(*notify.SenderOpts) {}, want: "effects client is nil"},
		"nil db":       {claims: claims, mutate: func(*notify.SenderOpts) {}, want: "db is nil"},
		"no key":       {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.APIKey = " " }, want: "API key is required"},
		"no from":      {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.From = "" }, want: "From address is required"},
		"bad from":     {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.From = "receipts" }, want: "not an email address"},
		"bad base":     {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.BaseURL = "api.sendgrid.com" }, want: "not an http(s) URL"},
		"neg window":   {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.CollapseWindow = -time.Second }, want: "negative"},
		"bad policy":   {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.Policies = map[string]notify.Policy{"receipt": "twice"} }, want: "unknown policy"},
		"neg lag":      {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.LookupLag = -time.Second }, want: "LookupLag -1s is negative"},
		"neg timeout":  {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.LookupTimeout = -time.Second }, want: "LookupTimeout -1s is negative"},
		"neg give up":  {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.LookupGiveUp = -time.Second }, want: "LookupGiveUp -1s is negative"},
		"lag > window": {claims: claims, db: pool, mutate: func(o *notify.SenderOpts) { o.CollapseWindow = time.Minute }, want: "send timeout 30s plus LookupLag 5m0s exceeds the collapse window 1m0s"},
		"nil opts key": {claims: claims, db: pool, mutate: nil, want: "API key is required"},
	} {
		var opts *notify.SenderOpts
		if tc.mutate != nil {
			o := ok
			tc.mutate(&o)
			opts = &o
		}
		var db effects.DB
		if tc.db != nil {
			db = tc.db
		}
		_, err := notify.NewSender(tc.claims, db, opts)
		require.ErrorContains(t, err, tc.want, name)
		require.NotContains(t, err.Error(), apiKey, name)
	}
}
