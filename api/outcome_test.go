package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

// moveOn changes what the order ord and its refund rid show after a
// response was sent: the order's status, the refund's ledger row, effect
// records and Stripe refund (the refund of 1.00 with reason), the start's
// outbox row sent. A replay must
// still say what the first response said.
func (b *bundle) moveOn(t *testing.T, ord, rid, reason, status string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `UPDATE orders SET status = $3, updated_at = now() WHERE tenant_id = $1 AND id = $2`, b.tenantA, ord, status)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE keyed_outbox SET sent_at = now(), run_id = 'run-1', attempts = attempts + 1 WHERE sent_at IS NULL`)
	require.NoError(t, err)
	if rid == "" {
		return
	}
	var reserved int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM refund_ledger WHERE tenant_id = $1 AND order_id = $2 AND refund_id = $3`,
		b.tenantA, ord, rid).Scan(&reserved))
	fxc := effectstest.NewClient(t, b.pool, nil)
	step := "refund_reserve"
	if reserved == 0 {
		b.reserve(t, ord, rid, 100, reason)
	} else {
		step = "refund_stripe"
		_, err := b.pool.Exec(b.ctx, `INSERT INTO refund_stripe_outcomes (tenant_id, order_id, refund_id, stripe_refund_id,
			payment_intent_id, status, amount_minor, currency, effect_key) VALUES ($1, $2, $3, 're_1', 'pi_1', 'succeeded', 100, 'usd', $4)`,
			b.tenantA, ord, rid, b.tenantA+":order:"+ord+":refund:"+rid+":refund_stripe")
		require.NoError(t, err)
	}
	cl, err := fxc.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey(b.tenantA, "order", ord, "refund", rid, step), Owner: "wf"})
	require.NoError(t, err)
	require.NoError(t, fxc.Complete(b.ctx, cl, map[string]any{"amount_minor": 100, "note": "<&>\u2028"}))
}

// TestReplaysAreByteIdentical replays every kind of stored response (the
// 2xx answers of every POST route: order 201 and 200, refund 202 and 200)
// after the order and the refund moved on, and gets the first body back
// byte for byte; so does a record of the earlier form, which holds the
// whole body.
func TestReplaysAreByteIdentical(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const reason = "Ada Lovelace phoned: damaged"
	cases := []struct {
		route, name string
		// first is sent once before the request under test, if set.
		first                  *probe
		req                    probe
		ord, rid, movedOnState string
	}{
		{route: api.RouteCreateOrder, name: "created",
			req: probe{"POST", "/v1/orders", b.keyA, "k-create", orderBody("ord_1", 1000), http.StatusCreated},
			ord: "ord_1", movedOnState: "paid"},
		{route: api.RouteCreateOrder, name: "identical order existed",
			first: &probe{"POST", "/v1/orders", b.keyA, "k-create-2a", orderBody("ord_2", 1000), http.StatusCreated},
			req:   probe{"POST", "/v1/orders", b.keyA, "k-create-2b", orderBody("ord_2", 1000), http.StatusOK},
			ord:   "ord_2", movedOnState: "partially_refunded"},
		{route: api.RouteCreateRefund, name: "requested",
			req: probe{"POST", "/v1/orders/ord_1/refunds", b.keyA, "k-refund", refundBody("r1", 100, reason), http.StatusAccepted},
			ord: "ord_1", rid: "r1", movedOnState: "partially_refunded"},
		{route: api.RouteCreateRefund, name: "requested before, with effects",
			first: &probe{"POST", "/v1/orders/ord_1/refunds", b.keyA, "k-refund-2a", refundBody("r2", 100, reason), http.StatusAccepted},
			req:   probe{"POST", "/v1/orders/ord_1/refunds", b.keyA, "k-refund-2b", refundBody("r2", 100, reason), http.StatusOK},
			ord:   "ord_1", rid: "r2", movedOnState: "partially_refunded"},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		if c.route == api.RouteCreateRefund {
			b.moveOn(t, "ord_1", "", "", "paid")
		}
		if c.first != nil {
			r := b.send(t, *c.first)
			require.Equal(t, c.first.want, r.status, "%s: %s", c.name, r.body)
			if c.rid != "" {
				b.moveOn(t, c.ord, c.rid, reason, "paid") // the 200 shows a reserved refund with an effect
			}
		}
		first := b.send(t, c.req)
		require.Equal(t, c.req.want, first.status, "%s: %s", c.name, first.body)
		b.moveOn(t, c.ord, c.rid, reason, c.movedOnState)
		again := b.send(t, c.req)
		require.Equal(t, "true", again.header.Get(api.HeaderReplayed), c.name)
		require.Equal(t, first.status, again.status, c.name)
		require.Equal(t, string(first.body), string(again.body), "%s: the replay is byte for byte", c.name)
		covered[c.route] = true
	}
	for _, pattern := range b.handler.RoutesForTest() {
		if strings.HasPrefix(pattern, "POST ") {
			require.True(t, covered[pattern], "POST route %q stores responses: add its kinds here", pattern)
		}
	}

	// A record of the earlier form holds the whole body, which is replayed
	// as it is, whatever the order says now.
	first := b.send(t, probe{"POST", "/v1/orders", b.keyA, "k-old", orderBody("ord_old", 500), http.StatusCreated})
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	_, err := b.pool.Exec(b.ctx, `UPDATE keyed_effects SET result = jsonb_build_object('status', 201, 'body', $2::text) WHERE key = $1`,
		requestKey(t, b.tenantA, "k-old"), string(first.body))
	require.NoError(t, err)
	b.moveOn(t, "ord_old", "", "", "paid")
	again := b.send(t, probe{"POST", "/v1/orders", b.keyA, "k-old", orderBody("ord_old", 500), http.StatusCreated})
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
	require.Equal(t, "true", again.header.Get(api.HeaderReplayed))
	require.Equal(t, string(first.body), string(again.body))

	// A binary of the earlier form reads the body as a string: today's
	// records make it fail (and the client retry) rather than replay an
	// empty body.
	var result []byte
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT result FROM keyed_effects WHERE key = $1`,
		requestKey(t, b.tenantA, "k-create")).Scan(&result))
	var earlier struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
	}
	require.Error(t, json.Unmarshal(result, &earlier), "%s", result)
}

// emailRE matches anything shaped like an email address.
var emailRE = regexp.MustCompile(`[^\s"'@:]+@[^\s"'@]+\.[A-Za-z]{2,}`)

// TestNoPersonalDataInEffectRecords creates a load of orders (each with
// its own customer email), replays and refunds some, and scans every
// column of every keyed_effects row: none holds an email address, a
// customer's email or a refund's reason.
func TestNoPersonalDataInEffectRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 200
	const reason = "Grace Hopper phoned: damaged"
	email := func(i int) string { return fmt.Sprintf("customer.%d@mail-%d.example.com", i, i) }
	body := func(i int) string {
		return fmt.Sprintf(`{"order_id":"ord_%d","amount_minor":1000,"currency":"usd","customer_email":%q,"payment_method":"pm_card_visa"}`, i, email(i))
	}
	var wg sync.WaitGroup
	got, replayed := make([]response, n), make([]response, n)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				got[i] = b.send(t, probe{"POST", "/v1/orders", b.keyA, fmt.Sprintf("load-%d", i), body(i), 0})
				if i%10 == 0 {
					replayed[i] = b.send(t, probe{"POST", "/v1/orders", b.keyA, fmt.Sprintf("load-%d", i), body(i), 0})
				}
			}
		}()
	}
	wg.Wait()
	for i, r := range got {
		require.Equal(t, http.StatusCreated, r.status, "order %d: %s", i, r.body)
		require.Contains(t, string(r.body), email(i), "the response shows the customer's email")
		if i%10 == 0 {
			require.Equal(t, string(r.body), string(replayed[i].body), "order %d replayed", i)
		}
	}
	_, err := b.pool.Exec(b.ctx, `UPDATE orders SET status = 'paid' WHERE tenant_id = $1 AND id LIKE 'ord_1%'`, b.tenantA)
	require.NoError(t, err)
	for i := 10; i < 20; i++ {
		r := b.send(t, probe{"POST", fmt.Sprintf("/v1/orders/ord_%d/refunds", i), b.keyA, fmt.Sprintf("refund-%d", i), refundBody("r1", 100, reason), 0})
		require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	}

	require.Equal(t, n+10, requireNoPersonalData(t, b.pool, reason), "one record per request")
	// The scan would see them: the emails are in the orders table.
	require.Equal(t, n, b.count(t, `SELECT count(*) FROM orders WHERE customer_email ~ $1`, emailRE.String()))
}

// requireNoPersonalData scans every column of every keyed_effects row for
// an email address and for each of texts, and returns how many rows it
// scanned.
func requireNoPersonalData(t *testing.T, db effects.DB, texts ...string) int {
	t.Helper()
	rows, err := db.Query(t.Context(), `SELECT key, to_jsonb(e)::text FROM keyed_effects e`)
	require.NoError(t, err)
	defer rows.Close()
	records := 0
	for rows.Next() {
		var key, row string
		require.NoError(t, rows.Scan(&key, &row))
		records++
		require.NotRegexp(t, emailRE, row, "effect record %s holds an email address", key)
		for _, text := range texts {
			require.NotContains(t, row, text, "effect record %s holds %q", key, text)
		}
	}
	require.NoError(t, rows.Err())
	return records
}
