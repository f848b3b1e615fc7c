package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
)

func TestCreateOrderThenGetIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	resp := b.do(t, "POST", "/v1/orders", b.keyA, "key-1", orderBody("ord_1", 1999))
	require.Equal(t, http.StatusCreated, resp.status, "%s", resp.body)
	require.Empty(t, resp.header.Get(api.HeaderReplayed))
	require.Equal(t, "application/json", resp.header.Get("Content-Type"))
	var created api.OrderCreated
	require.NoError(t, json.Unmarshal(resp.body, &created))
	require.Equal(t, "ord_1", created.Order.ID)
	require.Equal(t, b.tenantA, created.Order.TenantID, "the tenant comes from the API key")
	require.EqualValues(t, 1999, created.Order.AmountMinor)
	require.Equal(t, orders.StatusPending, created.Order.Status)
	require.Equal(t, orders.WorkflowID(b.tenantA, "ord_1"), created.WorkflowID)
	require.Equal(t, map[string]int{"orders": 1, "keyed_outbox": 1, "api_requests": 1, "effects": 0}, b.rows(t))

	got := b.do(t, "GET", "/v1/orders/ord_1", b.keyA, "", "")
	require.Equal(t, http.StatusOK, got.status, "%s", got.body)
	var detail api.OrderDetail
	require.NoError(t, json.Unmarshal(got.body, &detail))
	require.Equal(t, created.Order.ID, detail.Order.ID)
	require.Equal(t, "queued", detail.Start.State)
	require.Empty(t, detail.Effects)
	require.Contains(t, string(got.body), `"effects":[]`)

	// Once the relay has run, the start shows up.
	_, err := b.relay(t, nil).Poll(b.ctx)
	require.NoError(t, err)
	got = b.do(t, "GET", "/v1/orders/ord_1", b.keyA, "", "")
	require.NoError(t, json.Unmarshal(got.body, &detail))
	require.Equal(t, "started", detail.Start.State)
	require.NotEmpty(t, detail.Start.RunID)

	// An effect recorded by the pipeline is listed with its key, state and outcome.
	_, err = b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, result, finished_at)
		VALUES ($1, $2, 'charge', 'succeeded', 'wf/charge', '{"payment_intent_id":"pi_1","status":"succeeded"}', now())`,
		b.tenantA+":order:ord_1:charge", b.tenantA)
	require.NoError(t, err)
	got = b.do(t, "GET", "/v1/orders/ord_1", b.keyA, "", "")
	require.NoError(t, json.Unmarshal(got.body, &detail))
	require.Len(t, detail.Effects, 1)
	require.Equal(t, b.tenantA+":order:ord_1:charge", detail.Effects[0].Key)
	require.EqualValues(t, "succeeded", detail.Effects[0].State)
	require.JSONEq(t, `{"payment_intent_id":"pi_1","status":"succeeded"}`, string(detail.Effects[0].Outcome))

	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/ord_nope", b.keyA, "", "").status)
}

// The same POST retried 20 times, the first eight at once: one order, one
// outbox row, one stored response, every 2xx identical, and one workflow
// start once the relay runs.
func TestRetriedPostCreatesOneOrderAndReplaysTheFirstResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := orderBody("ord_retry", 4200)
	first, replays, conflicts := retryStorm(t, http.StatusCreated, func() response {
		return b.do(t, "POST", "/v1/orders", b.keyA, "retry-key", body)
	})
	require.Equal(t, 19, replays, "all but the first are replays")
	t.Logf("%d in-progress conflicts along the way", conflicts)
	require.Equal(t, map[string]int{"orders": 1, "keyed_outbox": 1, "api_requests": 1, "effects": 0}, b.rows(t))

	// Member order and whitespace are not a different request.
	reordered := `{ "payment_method":"pm_card_visa", "customer_email":"ada@example.com",
		"currency":"USD", "amount_minor":4200, "order_id":"ord_retry" }`
	r := b.do(t, "POST", "/v1/orders", b.keyA, "retry-key", reordered)
	require.Equal(t, http.StatusCreated, r.status)
	require.Equal(t, "true", r.header.Get(api.HeaderReplayed))
	require.Equal(t, string(first), string(r.body))

	_, err := b.relay(t, nil).Poll(b.ctx)
	require.NoError(t, err)
	wf := orders.WorkflowID(b.tenantA, "ord_retry")
	require.Equal(t, 1, b.starter.total())
	require.True(t, b.workflowExists(t, wf))

	require.Equal(t, 19.0+1, testutil.ToFloat64(b.metrics.IdemForTest("replayed")), "19 replays plus the reordered one")
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.IdemForTest("new")))
}

func TestSameKeyDifferentBodyIs422(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.do(t, "POST", "/v1/orders", b.keyA, "k-reuse", orderBody("ord_1", 1000))
	require.Equal(t, http.StatusCreated, first.status)
	before := b.rows(t)

	for _, body := range []string{orderBody("ord_1", 1001), orderBody("ord_2", 1000)} {
		r := b.do(t, "POST", "/v1/orders", b.keyA, "k-reuse", body)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s", r.body)
		e := decodeError(t, r)
		require.Equal(t, api.CodeIdempotencyKeyReused, e.Code)
		require.Equal(t, api.HeaderIdempotencyKey, e.Field)
		require.Contains(t, e.Message, "k-reuse")
		require.Contains(t, e.Message, "different request")
		require.Empty(t, r.header.Get(api.HeaderReplayed))
	}
	require.Equal(t, before, b.rows(t))
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/v1/orders/ord_1", b.keyA, "", "").status)
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/ord_2", b.keyA, "", "").status)
}

// holdOrder inserts the order row in an open transaction, so that a request
// creating the same order blocks on it while holding its Idempotency-Key.
// The returned function rolls the transaction back and lets it go on.
func (b *bundle) holdOrder(t *testing.T, tenant, id string) (release func()) {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `INSERT INTO orders (tenant_id, id, amount_minor, currency, customer_email, payment_method)
		VALUES ($1, $2, 1, 'usd', 'hold@example.com', 'pm_card_visa')`, tenant, id)
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(b.ctx) }) }
	t.Cleanup(release)
	return release
}

// waitRunning waits until the tenant's key is claimed by a running request.
func (b *bundle) waitRunning(t *testing.T, tenant, key string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM keyed_effects WHERE key = $1 AND state = 'claimed'`,
			requestKey(t, tenant, key)) == 1
	}, 5*time.Second, 5*time.Millisecond)
}

func TestSameKeyWhileFirstRunsIs409WithRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := b.holdOrder(t, b.tenantA, "ord_slow")
	firstDone := make(chan response, 1)
	go func() { firstDone <- b.do(t, "POST", "/v1/orders", b.keyA, "k-slow", orderBody("ord_slow", 700)) }()
	b.waitRunning(t, b.tenantA, "k-slow")

	r := b.do(t, "POST", "/v1/orders", b.keyA, "k-slow", orderBody("ord_slow", 700))
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	e := decodeError(t, r)
	require.Equal(t, api.CodeRequestInProgress, e.Code)
	require.Equal(t, api.HeaderIdempotencyKey, e.Field)

	// A different body is a conflict of its own, even while the first runs.
	r = b.do(t, "POST", "/v1/orders", b.keyA, "k-slow", orderBody("ord_slow", 701))
	require.Equal(t, http.StatusUnprocessableEntity, r.status)

	release()
	first := <-firstDone
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	again := b.do(t, "POST", "/v1/orders", b.keyA, "k-slow", orderBody("ord_slow", 700))
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(api.HeaderReplayed))
	require.Equal(t, string(first.body), string(again.body))
}

// Tenant B using tenant A's order ID and Idempotency-Key neither sees A's
// response nor blocks A, and A's orders are invisible to B.
func TestTenantsCannotReplayOrBlockEachOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.do(t, "POST", "/v1/orders", b.keyA, "shared-key", orderBody("ord_1", 1000))
	require.Equal(t, http.StatusCreated, a.status)

	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/ord_1", b.keyB, "", "").status,
		"B cannot read A's order")

	// Same key, same body, other tenant: a new order of B's own, not a replay.
	bResp := b.do(t, "POST", "/v1/orders", b.keyB, "shared-key", orderBody("ord_1", 1000))
	require.Equal(t, http.StatusCreated, bResp.status, "%s", bResp.body)
	require.Empty(t, bResp.header.Get(api.HeaderReplayed))
	require.NotEqual(t, string(a.body), string(bResp.body))
	var bCreated api.OrderCreated
	require.NoError(t, json.Unmarshal(bResp.body, &bCreated))
	require.Equal(t, b.tenantB, bCreated.Order.TenantID)

	// Same key, different body, other tenant: no 422 either.
	r := b.do(t, "POST", "/v1/orders", b.keyB, "shared-key-2", orderBody("ord_2", 5))
	require.Equal(t, http.StatusCreated, r.status)
	require.Equal(t, http.StatusCreated, b.do(t, "POST", "/v1/orders", b.keyA, "shared-key-2", orderBody("ord_2", 999)).status)

	// B holds a key in flight; A's request with the same key is not blocked.
	release := b.holdOrder(t, b.tenantB, "ord_3")
	bDone := make(chan response, 1)
	go func() { bDone <- b.do(t, "POST", "/v1/orders", b.keyB, "in-flight", orderBody("ord_3", 300)) }()
	b.waitRunning(t, b.tenantB, "in-flight")
	aResp := b.do(t, "POST", "/v1/orders", b.keyA, "in-flight", orderBody("ord_3", 300))
	require.Equal(t, http.StatusCreated, aResp.status, "%s", aResp.body)
	release()
	require.Equal(t, http.StatusCreated, (<-bDone).status)

	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM orders WHERE tenant_id = $1`, b.tenantA))
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM orders WHERE tenant_id = $1`, b.tenantB))
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name, header string
		second       string // a second Authorization header, if not empty
	}{
		{"missing", "", ""},
		{"two headers, valid key first", "Bearer " + b.keyA, "Bearer " + b.keyB},
		{"two headers, same key", "Bearer " + b.keyA, "Bearer " + b.keyA},
		{"unknown key", "Bearer sk_test_unknown_0000000000", ""},
		{"other scheme", "Basic " + b.keyA, ""},
		{"no token", "Bearer ", ""},
		{"key as prefix", "Bearer " + b.keyA[:len(b.keyA)-1], ""},
	} {
		for _, method := range []string{"POST /v1/orders", "GET /v1/orders/ord_1"} {
			m, path, _ := strings.Cut(method, " ")
			req, err := http.NewRequest(m, b.srv.URL+path, strings.NewReader(orderBody("ord_1", 1)))
			require.NoError(t, err)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			if tc.second != "" {
				req.Header.Add("Authorization", tc.second)
			}
			req.Header.Set(api.HeaderIdempotencyKey, "k")
			resp, err := b.srv.Client().Do(req)
			require.NoError(t, err)
			var e api.ErrorBody
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
			resp.Body.Close()
			require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s %s", tc.name, method)
			require.Equal(t, api.CodeUnauthorized, e.Error.Code)
			require.NotEmpty(t, resp.Header.Get("WWW-Authenticate"))
		}
	}
	require.Equal(t, map[string]int{"orders": 0, "keyed_outbox": 0, "api_requests": 0, "effects": 0}, b.rows(t))
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/healthz", "", "", "").status, "health needs no key")
}

// A failure after the order write rolls everything back: no order, no
// outbox row, no stored response, nothing started; the same key works once
// the fault is gone.
func TestFailureAfterOrderWriteLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `ALTER TABLE keyed_outbox ADD CONSTRAINT fault CHECK (false) NOT VALID`)
	require.NoError(t, err)
	r := b.do(t, "POST", "/v1/orders", b.keyA, "k-fault", orderBody("ord_f", 100))
	require.Equal(t, http.StatusInternalServerError, r.status, "%s", r.body)
	require.Equal(t, api.CodeInternal, decodeError(t, r).Code)
	require.NotContains(t, string(r.body), "fault", "database errors stay in the log")
	require.Equal(t, map[string]int{"orders": 0, "keyed_outbox": 0, "api_requests": 0, "effects": 0}, b.rows(t))
	n, err := b.relay(t, nil).Poll(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.False(t, b.workflowExists(t, orders.WorkflowID(b.tenantA, "ord_f")))

	_, err = b.pool.Exec(b.ctx, `ALTER TABLE keyed_outbox DROP CONSTRAINT fault`)
	require.NoError(t, err)
	r = b.do(t, "POST", "/v1/orders", b.keyA, "k-fault", orderBody("ord_f", 100))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Empty(t, r.header.Get(api.HeaderReplayed))
}

func TestOrderConflictWritesNothingForTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, http.StatusCreated, b.do(t, "POST", "/v1/orders", b.keyA, "k1", orderBody("ord_1", 100)).status)
	before := b.rows(t)
	r := b.do(t, "POST", "/v1/orders", b.keyA, "k2", orderBody("ord_1", 200))
	require.Equal(t, http.StatusConflict, r.status)
	e := decodeError(t, r)
	require.Equal(t, api.CodeOrderConflict, e.Code)
	require.Equal(t, "order_id", e.Field)
	require.Empty(t, r.header.Get("Retry-After"))
	require.Equal(t, before, b.rows(t))

	// An identical order under a new key is not a conflict: 200 with the order.
	r = b.do(t, "POST", "/v1/orders", b.keyA, "k3", orderBody("ord_1", 100))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox`))
}

// The process dies twice: once after the order commit and before any
// relay ran, once in the middle of a request. Either way the order ends
// with exactly one workflow run.
func TestKilledProcessStillStartsTheWorkflowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.startChild(t)
	client := &http.Client{Timeout: 10 * time.Second}

	// 1. Killed after the commit: the response was sent, no workflow yet.
	r := doAt(t, client, "http://"+c.addr, "POST", "/v1/orders", b.keyA, "k-commit", orderBody("ord_commit", 100))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)

	// 2. Killed mid-request: its transaction is open, blocked on ours.
	release := b.holdOrder(t, b.tenantA, "ord_mid")
	midDone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://"+c.addr+"/v1/orders", strings.NewReader(orderBody("ord_mid", 200)))
		req.Header.Set("Authorization", "Bearer "+b.keyA)
		req.Header.Set(api.HeaderIdempotencyKey, "k-mid")
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("got %d, want the connection to die", resp.StatusCode)
		}
		midDone <- err
	}()
	b.waitRunning(t, b.tenantA, "k-mid")
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, <-midDone)
	release()

	wfCommit, wfMid := orders.WorkflowID(b.tenantA, "ord_commit"), orders.WorkflowID(b.tenantA, "ord_mid")
	require.False(t, b.workflowExists(t, wfCommit), "nothing has started it yet")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM orders WHERE id = 'ord_commit'`))
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM orders WHERE id = 'ord_mid'`) == 0
	}, 5*time.Second, 10*time.Millisecond, "the killed request's transaction rolled back")

	// The client retries the killed request: 409 while the dead holder's
	// lease runs (5s in the child), then it takes the key over.
	var retried response
	require.Eventually(t, func() bool {
		retried = b.do(t, "POST", "/v1/orders", b.keyA, "k-mid", orderBody("ord_mid", 200))
		return retried.status != http.StatusConflict
	}, 15*time.Second, 100*time.Millisecond)
	require.Equal(t, http.StatusCreated, retried.status, "%s", retried.body)
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.IdemForTest("takeover")))

	// A relay starts both, once each; another pass starts nothing.
	r1 := b.relay(t, nil)
	n, err := r1.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	n, err = b.relay(t, nil).Poll(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1, b.starter.count(wfCommit))
	require.Equal(t, 1, b.starter.count(wfMid))
	require.True(t, b.workflowExists(t, wfCommit))
	require.True(t, b.workflowExists(t, wfMid))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM orders`))
}

func TestHealthzMetricsAndRouting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.do(t, "GET", "/healthz", "", "", "")
	require.Equal(t, http.StatusOK, r.status)
	require.JSONEq(t, `{"status":"ok"}`, string(r.body))
	require.NotEmpty(t, r.header.Get(api.HeaderRequestID))

	require.Equal(t, http.StatusCreated, b.do(t, "POST", "/v1/orders", b.keyA, "m1", orderBody("ord_m", 1)).status)
	require.Equal(t, http.StatusCreated, b.do(t, "POST", "/v1/orders", b.keyA, "m1", orderBody("ord_m", 1)).status)
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/zzz", b.keyA, "", "").status)

	r = b.do(t, "PUT", "/v1/orders", b.keyA, "", "")
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "POST", r.header.Get("Allow"))
	require.Equal(t, api.CodeMethodNotAllowed, decodeError(t, r).Code)
	r = b.do(t, "DELETE", "/v1/orders/ord_m", b.keyA, "", "")
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	r = b.do(t, "GET", "/v2/nothing", "", "", "")
	require.Equal(t, http.StatusNotFound, r.status)
	require.Equal(t, api.CodeNotFound, decodeError(t, r).Code)

	m := b.do(t, "GET", "/metrics", "", "", "")
	require.Equal(t, http.StatusOK, m.status)
	text := string(m.body)
	require.Contains(t, text, `keyed_api_requests_total{route="POST /v1/orders",status="201"} 2`)
	require.Contains(t, text, `keyed_api_requests_total{route="GET /v1/orders/{id}",status="404"} 1`)
	require.Contains(t, text, `keyed_api_requests_total{route="other",status="405"} 2`)
	require.Contains(t, text, `keyed_api_request_duration_seconds_count{route="POST /v1/orders"} 2`)
	require.Contains(t, text, `keyed_api_idempotency_total{outcome="replayed"} 1`)
	require.NotContains(t, text, "ord_m", "no order IDs in labels")

	// The database gone: unhealthy.
	b.pool.Close()
	require.Equal(t, http.StatusServiceUnavailable, b.do(t, "GET", "/healthz", "", "", "").status)
}

// Stop waits for a request in flight, which completes and is stored; new
// connections are refused afterwards.
func TestServerShutsDownGracefully(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv, err := api.NewServer("127.0.0.1:0", b.handler, &api.ServerOpts{Logger: b.logger})
	require.NoError(t, err)
	require.NoError(t, srv.Start(b.ctx))
	require.Error(t, srv.Start(b.ctx), "second start")
	base := "http://" + srv.Addr()

	release := b.holdOrder(t, b.tenantA, "ord_inflight")
	done := make(chan response, 1)
	go func() {
		done <- doAt(t, http.DefaultClient, base, "POST", "/v1/orders", b.keyA, "k-inflight", orderBody("ord_inflight", 10))
	}()
	b.waitRunning(t, b.tenantA, "k-inflight")

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		defer cancel()
		stopped <- srv.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v with a request in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	r := <-done
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.NoError(t, <-stopped)
	_, err = http.Get(base + "/healthz")
	require.Error(t, err, "the listener is closed")

	_, err = api.NewServer("no-port", b.handler, nil)
	require.Error(t, err)
	_, err = api.NewServer(":0", nil, nil)
	require.Error(t, err)
}

func TestPruneKeepsResponsesForTheRetention(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{unpartitioned: true})
	for _, k := range []string{"old", "young"} {
		require.Equal(t, http.StatusCreated, b.do(t, "POST", "/v1/orders", b.keyA, k, orderBody("ord_"+k, 1)).status)
	}
	age := func(k, ago string) {
		_, err := b.pool.Exec(b.ctx, `UPDATE keyed_effects SET created_at = now() - $2::interval, finished_at = now() - $2::interval
			WHERE key = $1`, requestKey(t, b.tenantA, k), ago)
		require.NoError(t, err)
	}
	age("old", "25 hours")
	age("young", "23 hours")
	// An abandoned claim from a holder that died two days ago, and a
	// pipeline's records as old: API pruning leaves those alone.
	_, err := b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, lease_until, created_at) VALUES
		($1, $2, 'api_request', 'claimed', 'dead', now() - interval '2 days', now() - interval '2 days'),
		($3, $2, 'charge', 'claimed', 'wf/charge', now() - interval '2 days', now() - interval '2 days')`,
		requestKey(t, b.tenantA, "abandoned"), b.tenantA, b.tenantA+":order:ord_old:charge")
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, result, created_at, finished_at)
		VALUES ($1, $2, 'mark_paid', 'succeeded', 'wf/mark_paid', '{}', now() - interval '2 days', now() - interval '2 days')`,
		b.tenantA+":order:ord_old:mark_paid", b.tenantA)
	require.NoError(t, err)

	n, err := b.handler.Prune(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	rows, err := b.pool.Query(b.ctx, `SELECT key FROM keyed_effects ORDER BY 1`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	young, charge := requestKey(t, b.tenantA, "young"), b.tenantA+":order:ord_old:charge"
	require.Equal(t, []string{young, charge, b.tenantA + ":order:ord_old:mark_paid"}, left)

	// The workers' prune of every effect, at the shortest retention a
	// worker accepts (fxapp.CheckRetention), keeps the young response too.
	fxc, err := effects.NewClient(b.pool, nil)
	require.NoError(t, err)
	n, err = fxc.Prune(b.ctx, &effects.PruneOpts{Retention: api.Retention})
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the old mark_paid record")
	rows, err = b.pool.Query(b.ctx, `SELECT key FROM keyed_effects ORDER BY 1`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{young, charge}, left)

	// Past the retention the key is fresh again: the order exists, so 200.
	r := b.do(t, "POST", "/v1/orders", b.keyA, "old", orderBody("ord_old", 1))
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, r.header.Get(api.HeaderReplayed))

	_, err = api.Prune(b.ctx, b.pool, &api.PruneOpts{Retention: time.Hour})
	require.Error(t, err, "under the documented 24h")
}

func TestNewHandlerValidatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keys, err := api.ParseKeys("acme=sk_test_0123456789abcdef")
	require.NoError(t, err)
	_, err = api.NewHandler(nil, keys, nil)
	require.Error(t, err)
	_, err = api.NewHandler(b.pool, nil, nil)
	require.ErrorIs(t, err, api.ErrNoKeys)
	_, err = api.NewHandler(b.pool, keys, &api.HandlerOpts{RequestLease: time.Second, RequestTimeout: 2 * time.Second})
	require.Error(t, err)
	_, err = api.NewHandler(b.pool, keys, &api.HandlerOpts{MaxBodyBytes: 10})
	require.Error(t, err)
}

func decodeError(t testing.TB, r response) *api.Error {
	t.Helper()
	var e api.ErrorBody
	require.NoError(t, json.Unmarshal(r.body, &e), "error body %s", r.body)
	require.NotNil(t, e.Error, "%s", r.body)
	require.NotEmpty(t, e.Error.Code)
	require.NotEmpty(t, e.Error.Message)
	return e.Error
}

// A client that hangs up mid-request does not abandon the work: the request
// finishes and stores its response, and the client's retry replays it.
func TestClientDisconnectStillStoresTheResponse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := b.holdOrder(t, b.tenantA, "ord_hangup")
	ctx, hangUp := context.WithCancel(b.ctx)
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", b.srv.URL+"/v1/orders", strings.NewReader(orderBody("ord_hangup", 10)))
		req.Header.Set("Authorization", "Bearer "+b.keyA)
		req.Header.Set(api.HeaderIdempotencyKey, "k-hangup")
		resp, err := b.srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	b.waitRunning(t, b.tenantA, "k-hangup")
	hangUp()
	require.ErrorIs(t, <-errc, context.Canceled)
	release()

	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM keyed_effects WHERE key = $1 AND state = 'succeeded'`,
			requestKey(t, b.tenantA, "k-hangup")) == 1
	}, 5*time.Second, 10*time.Millisecond, "the request ran to the end")
	r := b.do(t, "POST", "/v1/orders", b.keyA, "k-hangup", orderBody("ord_hangup", 10))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, "true", r.header.Get(api.HeaderReplayed))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM orders`))
}

// A request whose claim was taken over while it ran (its lease ran out)
// rolls its writes back and answers 409; the retry then runs.
func TestRequestThatLostItsKeyRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := b.holdOrder(t, b.tenantA, "ord_lost")
	done := make(chan response, 1)
	go func() { done <- b.do(t, "POST", "/v1/orders", b.keyA, "k-lost", orderBody("ord_lost", 100)) }()
	b.waitRunning(t, b.tenantA, "k-lost")
	// Another request takes the key over, then dies too.
	_, err := b.pool.Exec(b.ctx, `UPDATE keyed_effects SET generation = generation + 1, owner = 'other',
		lease_until = now() - interval '1 second' WHERE key = $1`, requestKey(t, b.tenantA, "k-lost"))
	require.NoError(t, err)
	release()
	r := <-done
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, api.CodeRequestInProgress, decodeError(t, r).Code)
	require.Contains(t, decodeError(t, r).Message, "outlived")
	require.Equal(t, strconv.Itoa(api.RetryAfterSeconds), r.header.Get("Retry-After"))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM orders`), "its writes rolled back")

	r = b.do(t, "POST", "/v1/orders", b.keyA, "k-lost", orderBody("ord_lost", 100))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.IdemForTest("takeover")))
}
