package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

// running is a long-running command (relay, serve) started in the
// background.
// Its output may be read once stop returned.
type running struct {
	stdout, stderr bytes.Buffer
	cancel         context.CancelFunc
	code           chan int
}

// startCommand runs the CLI in the background until stop.
func startCommand(vars map[string]string, args ...string) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, code: make(chan int, 1)}
	go func() {
		r.code <- run(ctx, args, &env{stdout: &r.stdout, stderr: &r.stderr, lookup: fxapptest.Lookup(vars)})
	}()
	return r
}

// stop ends the command as SIGINT would and returns its exit code, failing
// the test if it does not stop in time.
func (r *running) stop(t *testing.T) int {
	t.Helper()
	r.cancel()
	select {
	case code := <-r.code:
		return code
	case <-time.After(30 * time.Second):
		t.Fatal("the command did not stop")
		return -1
	}
}

// TestEveryCommandOnOneConnection runs every command of the command table
// (commands) against a worker with DATABASE_URL's pool_max_conns=1: each
// finishes within its deadline (starter runs each under a minute, and a
// wait for a second connection would run it out), with the outcome it has
// on a normal pool. A command added to the table without a step here fails
// the test.
func TestEveryCommandOnOneConnection(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, nil)
	pool := dbtest.Connect(t, w.Env["DATABASE_URL"]) // outlives the worker's
	vars := maps.Clone(w.Env)
	vars["DATABASE_URL"] += "&pool_max_conns=1"
	const apiKey = "sk_test_pool_0123456789abcdef"
	vars[api.EnvKeys] = "acme=" + apiKey
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ok := func(args ...string) string {
		t.Helper()
		code, out, errOut := starter(t, vars, args...)
		require.Equal(t, 0, code, "%v: %s%s", args, out, errOut)
		return out
	}
	wait := func(workflowID string) {
		t.Helper()
		require.NoError(t, w.Client.GetWorkflow(ctx, workflowID, "").Get(ctx, nil), workflowID)
	}
	// sent waits until the outbox row of workflowID is marked sent.
	sent := func(workflowID string) {
		t.Helper()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_outbox WHERE workflow_id = $1 AND sent_at IS NOT NULL`,
				workflowID).Scan(&n))
			return n == 1
		}, 30*time.Second, 50*time.Millisecond, workflowID)
	}
	order := []string{"--tenant", "acme", "--order", "one-1"}

	steps := []struct {
		name string
		run  func()
	}{
		{"migrate", func() { require.Contains(t, ok("migrate"), "is up to date") }},
		{"create", func() {
			ok(append([]string{"create", "--amount", "2500", "--currency", "eur", "--email", "ann@example.com",
				"--payment-method", "pm_card_visa"}, order...)...)
			wait(orders.WorkflowID("acme", "one-1"))
		}},
		{"start", func() { ok(append([]string{"start"}, order...)...) }},
		{"refund", func() {
			ok(append([]string{"refund", "--refund", "r1", "--amount", "500"}, order...)...)
			wait(refunds.NewInput("acme", "one-1", "r1", 500, "").WorkflowID())
		}},
		{"show", func() { require.Contains(t, ok(append([]string{"show"}, order...)...), "partially_refunded") }},
		{"attention", func() { require.Contains(t, ok("attention"), "no run waits for a decision") }},
		{"resolve", func() {
			key := effects.MustKey("acme", "order", "one-gone", "receipt")
			fxc := effectstest.NewClient(t, pool, nil)
			cl, err := fxc.Claim(ctx, effects.ClaimParams{Key: key, Owner: "wf/receipt"})
			require.NoError(t, err)
			require.NoError(t, fxc.Fail(ctx, cl, effects.NewCodedError("ambiguous", "may have been sent")))
			runDeleted(t, pool, key)
			require.Contains(t, ok("resolve", "--key", key.String(), "--as", "retry", "--reason", "not in SendGrid", "--by", "ops"), "is now")
		}},
		{"reconcile", func() { require.Contains(t, ok("reconcile", "--since", "1h"), "no findings") }},
		{"doctor", func() {
			code, out, errOut := starter(t, vars, "doctor", "--rules", "../../deploy/prometheus/keyed.rules.yml",
				"--metrics-url", "http://"+w.Metrics.Addr()+"/metrics")
			// The one failure: this pool_max_conns=1 read as the worker's.
			require.Equal(t, doctor.ExitFailures, code, out+errOut)
			require.Regexp(t, `(?m)^FAIL\s+pool\s+worker\s+pool_max_conns=1`, out)
			require.Equal(t, 1, strings.Count(out, "\nFAIL"), out)
		}},
		{"relay", func() {
			// With the worker (and its relay) stopped, the relay alone
			// starts a committed order's checkout.
			require.NoError(t, w.Stop())
			enqueue(t, pool, "one-2")
			r := startCommand(vars, "relay")
			sent(orders.WorkflowID("acme", "one-2"))
			require.Equal(t, 0, r.stop(t), r.stderr.String())
			require.Contains(t, r.stdout.String(), "outbox relay running")
		}},
		{"serve", func() {
			addr, metricsAddr := freeAddr(t), freeAddr(t)
			r := startCommand(vars, "serve", "--relay", "--addr", addr, "--metrics-addr", metricsAddr)
			base := "http://" + addr
			require.Eventually(t, func() bool {
				resp, err := http.Get(base + "/healthz")
				if err == nil {
					resp.Body.Close()
				}
				return err == nil && resp.StatusCode == http.StatusOK
			}, 30*time.Second, 20*time.Millisecond, "serve did not start")
			for _, c := range []struct {
				method, path, idem, body string
				want                     int
			}{
				{"GET", "/healthz", "", "", http.StatusOK},
				{"GET", "/metrics", "", "", http.StatusNotFound}, // on METRICS_ADDR, never where tenants call
				{"POST", "/v1/orders", "one-3", `{"order_id":"one-3","amount_minor":900,"currency":"usd","customer_email":"bo@example.com","payment_method":"pm_card_visa"}`, http.StatusCreated},
				{"GET", "/v1/orders/one-1", "", "", http.StatusOK},
				{"POST", "/v1/orders/one-1/refunds", "one-1-r2", `{"refund_id":"r2","amount_minor":100}`, http.StatusAccepted},
				{"POST", "/v1/orders/one-1/refunds", "one-1-r2", `{"refund_id":"r2","amount_minor":100}`, http.StatusAccepted},
				{"GET", "/v1/orders/one-1/refunds/r2", "", "", http.StatusOK},
			} {
				got, body := call(t, base, apiKey, c.method, c.path, c.idem, c.body)
				require.Equal(t, c.want, got, "%s %s: %s", c.method, c.path, body)
			}
			got, body := call(t, "http://"+metricsAddr, "", "GET", "/metrics", "", "")
			require.Equal(t, http.StatusOK, got)
			require.Contains(t, body, "keyed_api_requests_total")
			sent(orders.WorkflowID("acme", "one-3"))
			sent(refunds.NewInput("acme", "one-1", "r2", 100, "").WorkflowID())
			require.Equal(t, 0, r.stop(t), r.stderr.String())
			require.Contains(t, r.stdout.String(), "serving keyed's API on http://"+addr)
			require.Contains(t, r.stdout.String(), "serving /metrics and /healthz on http://"+metricsAddr)
		}},
	}
	names := make([]string, 0, len(steps))
	for _, s := range steps {
		names = append(names, s.name)
	}
	for _, c := range commands() {
		require.Contains(t, names, c.name, "command %q has no step here: add one", c.name)
	}
	require.Len(t, names, len(commands()))
	for _, s := range steps {
		t.Logf("starter %s on one connection", s.name)
		s.run()
	}
}

// enqueue commits tenant acme's order id and its checkout's outbox row, as
// create does before it starts the run.
func enqueue(t *testing.T, pool *pgxpool.Pool, id string) {
	t.Helper()
	ctx := context.Background()
	store, err := orders.NewStore(pool)
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, _, err := store.CreateAndEnqueueTx(ctx, tx, orders.NewOrder{TenantID: "acme", ID: id, AmountMinor: 700,
			Currency: "usd", CustomerEmail: "cy@example.com", PaymentMethod: "pm_card_visa"})
		return err
	})
	require.NoError(t, err)
}

// freeAddr returns a local address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// call sends one request to the API at base and returns its status and
// body.
func call(t *testing.T, base, apiKey, method, path, idem, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if idem != "" {
		req.Header.Set(api.HeaderIdempotencyKey, idem)
	}
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Do(req)
	require.NoError(t, err, fmt.Sprintf("%s %s", method, path))
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(got)
}
