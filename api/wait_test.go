package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/idempotency"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox/temporalstart"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// waitBundle is the whole path with Prefer: wait: a worker app (its
// Temporal worker, activities and outbox relay, fake Stripe and SendGrid),
// and the API in front of it with a Starter on the worker's task queue.
type waitBundle struct {
	w           *fxapptest.Worker
	srv         *httptest.Server
	tenant, key string
}

func waitSetup(t testing.TB) *waitBundle {
	t.Helper()
	return waitSetupOn(t, devServer)
}

// waitSetupOn is waitSetup with a worker app on srv.
func waitSetupOn(t testing.TB, srv *devserver.Server) *waitBundle {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := &waitBundle{w: fxapptest.Start(t, &fxapptest.Opts{Server: srv, Logger: quiet}),
		tenant: "w" + randomID(4), key: "sk_test_" + randomID(12)}
	keys, err := api.ParseKeys(b.tenant + "=" + b.key)
	require.NoError(t, err)
	h, err := api.NewHandler(b.w.Pool, keys, &api.HandlerOpts{Effects: b.w.Effects, Logger: quiet, Starter: b.starter()})
	require.NoError(t, err)
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	return b
}

// starter starts runs as the worker's relay does.
func (b *waitBundle) starter() *temporalstart.Starter {
	return temporalstart.New(b.w.Client, &temporalstart.Opts{TaskQueue: b.w.Env["TEMPORAL_TASK_QUEUE"],
		Configure: pipeline.Configure(workflows.Pipelines(), b.w.Pool)})
}

// post sends a POST with the Idempotency-Key and, unless empty, Prefer.
func (b *waitBundle) post(t testing.TB, base, path, idem, body, prefer string) response {
	t.Helper()
	req, err := http.NewRequest("POST", base+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.key)
	req.Header.Set(api.HeaderIdempotencyKey, idem)
	if prefer != "" {
		req.Header.Set(idempotency.HeaderPrefer, prefer)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: got}
}

func (b *waitBundle) order(t testing.TB, idem, body, prefer string) (response, api.OrderCreated) {
	t.Helper()
	r := b.post(t, b.srv.URL, "/v1/orders", idem, body, prefer)
	var oc api.OrderCreated
	if r.status < 300 {
		require.NoError(t, json.Unmarshal(r.body, &oc), "%s", r.body)
	}
	return r, oc
}

// runs counts the workflow runs of wf.
func (b *waitBundle) runs(t *testing.T, wf string) int64 {
	t.Helper()
	n, err := b.w.Client.CountWorkflow(t.Context(), &workflowservice.CountWorkflowExecutionsRequest{Query: fmt.Sprintf("WorkflowId = '%s'", wf)})
	require.NoError(t, err)
	return n.GetCount()
}

// requireReplay checks that a retry, without Prefer, replays first byte for
// byte, its Location included.
func (b *waitBundle) requireReplay(t *testing.T, path, idem, body string, first response) {
	t.Helper()
	again := b.post(t, b.srv.URL, path, idem, body, "")
	require.Equal(t, first.status, again.status, "%s", again.body)
	require.Equal(t, string(first.body), string(again.body))
	require.Equal(t, "true", again.header.Get(api.HeaderReplayed))
	require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
	require.Empty(t, again.header.Get(idempotency.HeaderPreferenceApplied), "a replay did not wait")
}

// With Prefer: wait=10 the answer says paid or declined with the charge's
// outcome (201), or 202 pending with a Location when the charge outlasts the
// wait; each replays byte for byte, the stored 202 too, while GET shows the
// order paid later. One charge per paid order, none for the declined one.
func TestPreferWaitAnswersPaidDeclinedOrPending(t *testing.T) {
	t.Parallel()
	b := waitSetup(t)

	paidBody := orderBody("ord_paid", 1250)
	paid, oc := b.order(t, "k-paid", paidBody, "wait=10")
	require.Equal(t, http.StatusCreated, paid.status, "%s", paid.body)
	require.Equal(t, orders.StatusPaid, oc.Order.Status)
	require.Equal(t, api.ChargeSucceeded, oc.Charge.State)
	require.True(t, strings.HasPrefix(oc.Charge.PaymentIntentID, "pi_"), oc.Charge.PaymentIntentID)
	require.Equal(t, "/v1/orders/ord_paid", paid.header.Get("Location"))
	require.Equal(t, "wait=10", paid.header.Get(idempotency.HeaderPreferenceApplied))
	b.requireReplay(t, "/v1/orders", "k-paid", paidBody, paid)

	declinedBody := strings.Replace(orderBody("ord_declined", 1250), "pm_card_visa", "pm_card_chargeDeclined", 1)
	declined, oc := b.order(t, "k-declined", declinedBody, "wait=10")
	require.Equal(t, http.StatusCreated, declined.status, "%s", declined.body)
	require.Equal(t, orders.StatusFailed, oc.Order.Status)
	require.Equal(t, api.ChargeDeclined, oc.Charge.State)
	require.NotEmpty(t, oc.Charge.ErrorCode)
	b.requireReplay(t, "/v1/orders", "k-declined", declinedBody, declined)

	b.w.Stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultLatency, Delay: 3 * time.Second, Match: "ord_slow"})
	// The slow order's ID holds characters a path must escape: its
	// Location names it, not a query or a fragment.
	const slowID = "ord_slow?x=1#f%20"
	slowBody := orderBody(slowID, 1250)
	slow, oc := b.order(t, "k-slow", slowBody, "wait=1")
	require.Equal(t, http.StatusAccepted, slow.status, "%s", slow.body)
	require.Equal(t, orders.StatusPending, oc.Order.Status)
	require.Equal(t, api.ChargePending, oc.Charge.State)
	require.Equal(t, "/v1/orders/ord_slow%3Fx=1%23f%2520", slow.header.Get("Location"))
	b.requireReplay(t, "/v1/orders", "k-slow", slowBody, slow)
	require.Eventually(t, func() bool {
		r := doAt(t, b.srv.Client(), b.srv.URL, "GET", slow.header.Get("Location"), b.key, "", "")
		var d api.OrderDetail
		require.NoError(t, json.Unmarshal(r.body, &d))
		return d.Order.Status == orders.StatusPaid
	}, 30*time.Second, 50*time.Millisecond, "the relay's or the API's run goes on after the 202")
	b.requireReplay(t, "/v1/orders", "k-slow", slowBody, slow)

	for _, id := range []string{"ord_paid", "ord_declined", slowID} {
		require.EqualValues(t, 1, b.runs(t, orders.WorkflowID(b.tenant, id)), id)
	}
	require.Equal(t, 2, b.w.Stripe.Charges(), "one charge per paid order, none for the declined")
}

// Concurrent duplicates share one run and one answer: eight requests with
// one key get the same bytes (one fresh, the rest replayed after waiting
// for it), four with keys of their own for the same order each see it
// paid; one run, one charge.
func TestPreferWaitDuplicatesShareOneRunAndOneAnswer(t *testing.T) {
	t.Parallel()
	b := waitSetup(t)
	body := orderBody("ord_dup", 990)
	var mu sync.Mutex
	var same, others []response
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			idem := "k-dup"
			if i >= 8 {
				idem = fmt.Sprintf("k-dup-%d", i)
			}
			r := b.post(t, b.srv.URL, "/v1/orders", idem, body, "wait=10")
			mu.Lock()
			defer mu.Unlock()
			if i < 8 {
				same = append(same, r)
			} else {
				others = append(others, r)
			}
		})
	}
	wg.Wait()
	fresh := 0
	for _, r := range same {
		require.Contains(t, []int{http.StatusCreated, http.StatusOK}, r.status, "%s", r.body) // 200 when another key created it
		require.Equal(t, string(same[0].body), string(r.body), "one answer")
		if r.header.Get(api.HeaderReplayed) == "" {
			fresh++
		}
	}
	require.Equal(t, 1, fresh, "one request ran, seven replayed its answer")
	for _, r := range others {
		require.Contains(t, []int{http.StatusCreated, http.StatusOK}, r.status, "%s", r.body)
		var oc api.OrderCreated
		require.NoError(t, json.Unmarshal(r.body, &oc))
		require.Equal(t, orders.StatusPaid, oc.Order.Status)
		require.Equal(t, api.ChargeSucceeded, oc.Charge.State)
	}
	require.EqualValues(t, 1, b.runs(t, orders.WorkflowID(b.tenant, "ord_dup")))
	require.Equal(t, 1, b.w.Stripe.Charges())
}

// A refund waits for Stripe's refund: 201 refunded with its ID, replayed
// byte for byte.
func TestPreferWaitRefund(t *testing.T) {
	t.Parallel()
	b := waitSetup(t)
	paid, _ := b.order(t, "k-order", orderBody("ord_r", 1000), "wait=10")
	require.Equal(t, http.StatusCreated, paid.status, "%s", paid.body)
	body := refundBody("r1", 400, "damaged")
	r := b.post(t, b.srv.URL, "/v1/orders/ord_r/refunds", "k-refund", body, "wait=10")
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	var v api.RefundView
	require.NoError(t, json.Unmarshal(r.body, &v))
	require.Equal(t, api.RefundRefunded, v.State)
	require.NotEmpty(t, v.StripeRefundID)
	require.Equal(t, "/v1/orders/ord_r/refunds/r1", r.header.Get("Location"))
	b.requireReplay(t, "/v1/orders/ord_r/refunds", "k-refund", body, r)

	// Stripe refuses the next one for good: 201 failed, its reservation
	// released.
	b.w.Stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultRefuseRefund, Match: "POST /v1/refunds"})
	body = refundBody("r2", 300, "")
	r = b.post(t, b.srv.URL, "/v1/orders/ord_r/refunds", "k-refused", body, "wait=10")
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.NoError(t, json.Unmarshal(r.body, &v))
	require.Equal(t, api.RefundFailed, v.State)
	require.True(t, v.Released, "%s", r.body)
	b.requireReplay(t, "/v1/orders/ord_r/refunds", "k-refused", body, r)
}

// The API process is killed in the middle of a Prefer: wait request, once
// the order and its start committed: while it waits on the charge (it
// started the run), and before it could start the run at all (its Temporal
// is unreachable). Nothing is lost and nothing doubles: the worker's relay
// starts the run if the API did not, the order ends paid, fake Stripe
// counts one charge, and the client's retry of the same request (409 until
// the dead holder's lease ends) answers it paid and replays that answer.
func TestAPIKilledMidPreferWaitLosesNothing(t *testing.T) {
	t.Parallel()
	for name, temporalAddr := range map[string]string{"waiting on the charge": "", "before the start": blackhole(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := waitSetup(t)
			if temporalAddr == "" {
				temporalAddr = b.w.Env["TEMPORAL_ADDRESS"]
				// The charge happens at Stripe, and its answer is held while the API is killed.
				b.w.Stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultHoldResponse, Delay: 2 * time.Second, Match: "ord_kill"})
			}
			c := startChildOn(t, b.w.Env["DATABASE_URL"], b.tenant+"="+b.key, childTemporalEnv+"="+temporalAddr,
				childNamespaceEnv+"="+b.w.Env["TEMPORAL_NAMESPACE"], childTaskQueueEnv+"="+b.w.Env["TEMPORAL_TASK_QUEUE"])
			body := orderBody("ord_kill", 1500)
			killed := make(chan error, 1)
			go func() {
				req, err := http.NewRequest("POST", "http://"+c.addr+"/v1/orders", strings.NewReader(body))
				if err != nil {
					killed <- err
					return
				}
				req.Header.Set("Authorization", "Bearer "+b.key)
				req.Header.Set(api.HeaderIdempotencyKey, "k-kill")
				req.Header.Set(idempotency.HeaderPrefer, "wait=2")
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_ = resp.Body.Close()
				}
				killed <- err
			}()
			require.Eventually(t, func() bool {
				var n int
				require.NoError(t, b.w.Pool.QueryRow(t.Context(), `SELECT count(*) FROM orders o JOIN keyed_outbox x ON x.workflow_id = $2
					WHERE o.tenant_id = $1 AND o.id = 'ord_kill'`, b.tenant, orders.WorkflowID(b.tenant, "ord_kill")).Scan(&n))
				return n == 1
			}, 10*time.Second, 5*time.Millisecond, "the order and its start committed")
			require.NoError(t, c.cmd.Process.Kill())
			require.Error(t, <-killed, "the client never got an answer")

			var r response
			require.Eventually(t, func() bool {
				r = b.post(t, b.srv.URL, "/v1/orders", "k-kill", body, "wait=10")
				return r.status != http.StatusConflict
			}, 30*time.Second, 200*time.Millisecond, "the dead holder's key frees when its lease ends")
			require.Equal(t, http.StatusOK, r.status, "%s", r.body) // the order existed: the retry took the key over
			var oc api.OrderCreated
			require.NoError(t, json.Unmarshal(r.body, &oc))
			require.Equal(t, orders.StatusPaid, oc.Order.Status)
			b.requireReplay(t, "/v1/orders", "k-kill", body, r)
			require.EqualValues(t, 1, b.runs(t, orders.WorkflowID(b.tenant, "ord_kill")))
			require.Equal(t, 1, b.w.Stripe.Charges(), "one charge")
		})
	}
}

// The relay started the run first (a POST without the preference, its
// charge slowed): a Prefer: wait request under another key joins that run
// and answers paid. One run, one charge.
func TestPreferWaitJoinsTheRelaysRun(t *testing.T) {
	t.Parallel()
	b := waitSetup(t)
	b.w.Stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultLatency, Delay: time.Second, Match: "ord_join"})
	body := orderBody("ord_join", 700)
	first, _ := b.order(t, "k-join-1", body, "")
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	wf := orders.WorkflowID(b.tenant, "ord_join")
	require.Eventually(t, func() bool {
		var sent bool
		require.NoError(t, b.w.Pool.QueryRow(t.Context(), `SELECT sent_at IS NOT NULL FROM keyed_outbox WHERE workflow_id = $1`, wf).Scan(&sent))
		return sent
	}, 10*time.Second, 5*time.Millisecond, "the worker's relay started the run")
	joined, oc := b.order(t, "k-join-2", body, "wait=10")
	require.Equal(t, http.StatusOK, joined.status, "%s", joined.body)
	require.Equal(t, orders.StatusPaid, oc.Order.Status)
	require.EqualValues(t, 1, b.runs(t, wf))
	require.Equal(t, 1, b.w.Stripe.Charges())
}

// The API started the run first (no worker polls its task queue, so the
// wait runs out: 202): the relay's start of the row then collapses into
// that run.
func TestRelayCollapsesIntoTheAPIsRun(t *testing.T) {
	t.Parallel()
	c, err := client.Dial(client.Options{HostPort: temporalAddr, Logger: quietLogger{}})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	tq := "api-wait-" + randomID(4)
	b := setup(t, setupOpts{handler: &api.HandlerOpts{Starter: temporalstart.New(c, &temporalstart.Opts{TaskQueue: tq})}})
	b.starter.next = pipeline.Starter(c, nil, tq, workflows.Pipelines())
	req, err := http.NewRequest("POST", b.srv.URL+"/v1/orders", strings.NewReader(orderBody("ord_first", 500)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.keyA)
	req.Header.Set(api.HeaderIdempotencyKey, "k-first")
	req.Header.Set(idempotency.HeaderPrefer, "wait=1")
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	wf := orders.WorkflowID(b.tenantA, "ord_first")
	desc, err := c.DescribeWorkflow(t.Context(), wf, "")
	require.NoError(t, err, "the API started the run")

	n, err := b.relay(t, nil).Poll(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 1, b.starter.count(wf))
	var runID string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT run_id FROM keyed_outbox WHERE workflow_id = $1`, wf).Scan(&runID))
	require.Equal(t, desc.RawResponse.GetWorkflowExecutionInfo().GetExecution().GetRunId(), runID, "the relay's start collapsed into the API's run")
}

// blackhole returns the address of a listener that accepts connections and
// never answers: a Temporal the API cannot start anything on, until the
// wait runs out.
func blackhole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return l.Addr().String()
}

// With Temporal unreachable (the port refuses connections) or silent (it
// accepts them and never answers), Prefer: wait still answers within the
// wait: the order and its start commit, the answer is 202 pending with its
// Location, and the outbox row stays unsent for a relay to start later.
func TestPreferWaitWithTemporalDownAnswersPending(t *testing.T) {
	t.Parallel()
	for name, addr := range map[string]func(t *testing.T) string{"refused": refusingAddr, "silent": silentAddr} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := client.NewLazyClient(client.Options{HostPort: addr(t), Logger: quietLogger{}})
			require.NoError(t, err)
			t.Cleanup(c.Close)
			starter := temporalstart.New(c, &temporalstart.Opts{TaskQueue: "keyed-nowhere-" + randomID(4)})
			b := setup(t, setupOpts{handler: &api.HandlerOpts{Starter: starter, MaxWait: 2 * time.Second}})

			req, err := http.NewRequest("POST", b.srv.URL+"/v1/orders", strings.NewReader(orderBody("ord_down", 100)))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+b.keyA)
			req.Header.Set(api.HeaderIdempotencyKey, "k-down")
			req.Header.Set(idempotency.HeaderPrefer, "wait=2")
			start := time.Now()
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			took := time.Since(start)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)

			require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", body)
			require.Equal(t, "/v1/orders/ord_down", resp.Header.Get("Location"))
			require.Less(t, took, 2*time.Second+api.DefaultRequestTimeout, "the wait bounds the request")
			var oc api.OrderCreated
			require.NoError(t, json.Unmarshal(body, &oc))
			require.Equal(t, orders.StatusPending, oc.Order.Status)
			wf := orders.WorkflowID(b.tenantA, "ord_down")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE sent_at IS NULL AND workflow_id = $1`, wf))
		})
	}
}

// refusingAddr returns a local address that refuses connections.
func refusingAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// silentAddr returns a local address that accepts connections and never
// writes to them, until the test ends.
func silentAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		require.NoError(t, ln.Close())
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			require.NoError(t, c.Close())
		}
	})
	return ln.Addr().String()
}
