package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"

	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// terminator ends every Postgres backend of one application name, as an
// administrator or a failover does.
type terminator struct {
	b     *bundle
	app   string
	count atomic.Int64
}

func (k *terminator) terminate(t *testing.T) {
	var n int64
	err := k.b.pool.QueryRow(context.Background(), `
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, k.app).Scan(&n)
	if err != nil {
		t.Errorf("terminate backends of %s: %v", k.app, err)
	}
	k.count.Add(n)
}

// boundaryInterceptor terminates the worker's backends before and after the
// first attempt of every activity: at each step boundary.
type boundaryInterceptor struct {
	interceptor.WorkerInterceptorBase
	t *testing.T
	k *terminator
}

func (i *boundaryInterceptor) InterceptActivity(ctx context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	return &boundaryActivity{ActivityInboundInterceptorBase: interceptor.ActivityInboundInterceptorBase{Next: next}, i: i}
}

type boundaryActivity struct {
	interceptor.ActivityInboundInterceptorBase
	i *boundaryInterceptor
}

func (a *boundaryActivity) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	first := activity.GetInfo(ctx).Attempt == 1
	if first {
		a.i.k.terminate(a.i.t)
	}
	out, err := a.Next.ExecuteActivity(ctx, in)
	if first {
		a.i.k.terminate(a.i.t)
	}
	return out, err
}

// afterProvider serves h and then, once per effect key, terminates the
// worker's backends: the provider acted, and storing its outcome meets a
// dead connection.
func afterProvider(t *testing.T, k *terminator, h http.Handler, keyOf func(r *http.Request, body []byte) string) http.Handler {
	var mu sync.Mutex
	done := map[string]bool{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
		key := keyOf(r, body)
		if r.Method != http.MethodPost || key == "" {
			return
		}
		mu.Lock()
		first := !done[key]
		done[key] = true
		mu.Unlock()
		if first {
			k.terminate(t)
		}
	})
}

func sendGridEffectKey(_ *http.Request, body []byte) string {
	var req struct {
		CustomArgs map[string]string `json:"custom_args"`
	}
	_ = json.Unmarshal(body, &req)
	return req.CustomArgs[notify.CustomArgEffectKey]
}

// TestStepBoundariesSurviveTerminatedBackends terminates the worker's
// Postgres backends before and after every step's first attempt and right
// after each provider acted. Every order still ends paid with one charge and
// one receipt, or declined with none, and no person is involved.
func TestStepBoundariesSurviveTerminatedBackends(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := &terminator{b: b, app: "keyed-boundary-" + randomID()}
	stripeSrv := httptest.NewServer(afterProvider(t, k, b.stripe, func(r *http.Request, _ []byte) string {
		return r.Header.Get("Idempotency-Key")
	}))
	t.Cleanup(stripeSrv.Close)
	mailSrv := httptest.NewServer(afterProvider(t, k, b.mail, sendGridEffectKey))
	t.Cleanup(mailSrv.Close)

	pool := dbtest.Connect(t, b.dbURL+"&application_name="+k.app)
	fxc := effectstest.NewClient(t, pool, &effects.ClientOpts{Logger: quiet()})
	sc, err := stripestep.NewClient(stripeKey, stripeSrv.URL, nil)
	require.NoError(t, err)
	sender, err := notify.NewSender(fxc, pool, &notify.SenderOpts{APIKey: sendgridKey, BaseURL: mailSrv.URL, From: receiptFrom, Logger: quiet()})
	require.NoError(t, err)
	w := worker.New(b.temporal, b.taskQueue, worker.Options{Interceptors: []interceptor.WorkerInterceptor{&boundaryInterceptor{t: t, k: k}}})
	deps := pipeline.Deps{DB: pool, Effects: fxc, Logger: quiet(), Providers: b.providers(t, pool, fxc, sc, sender)}
	require.NoError(t, pipeline.Register(w, workflows.Pipelines(), deps, nil))
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	const n = 4
	var started []*outbox.Started
	for i := range n {
		pm := "pm_card_visa"
		if i == n-1 {
			pm = "pm_card_chargeDeclined"
		}
		o := b.order(t, fmt.Sprintf("b%d", i), 1000+int64(i), pm)
		started = append(started, b.start(t, orders.NewOrderInput(b.tenant, o.ID)))
	}
	for i, st := range started {
		_, err := b.wait(t, st)
		id := fmt.Sprintf("b%d", i)
		o, gerr := b.orders.Get(b.ctx, b.tenant, id)
		require.NoError(t, gerr)
		chargeKey, kerr := orders.NewOrderInput(b.tenant, id).EffectKey(orders.StepCharge)
		require.NoError(t, kerr)
		receiptKey, kerr := orders.NewOrderInput(b.tenant, id).EffectKey(orders.StepReceipt)
		require.NoError(t, kerr)
		if i == n-1 {
			require.Error(t, err, "the declined order's run fails")
			require.Equal(t, orders.StatusFailed, o.Status)
			require.Zero(t, b.stripe.ChargesForKey(chargeKey.String()))
			require.Empty(t, b.mail.MessagesFor(notify.CustomArgEffectKey, receiptKey.String()))
			continue
		}
		require.NoError(t, err, "order %s: %v", id, b.records(t, id))
		require.Equal(t, orders.StatusPaid, o.Status)
		require.Equal(t, 1, b.stripe.ChargesForKey(chargeKey.String()), "one charge for %s", id)
		require.Len(t, b.mail.MessagesFor(notify.CustomArgEffectKey, receiptKey.String()), 1, "one receipt for %s", id)
	}
	require.Positive(t, k.count.Load(), "backends were terminated")
	t.Logf("terminated %d backends across %d orders", k.count.Load(), n)
}
