package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

func refundBody(id string, amount int64, reason string) string {
	return fmt.Sprintf(`{"refund_id":%q,"amount_minor":%d,"reason":%q}`, id, amount, reason)
}

// paidOrder creates the order through the API and marks it paid, as the
// order pipeline would.
func (b *bundle) paidOrder(t testing.TB, id string, amount int64) {
	t.Helper()
	b.orderWithStatus(t, id, amount, "paid")
}

func (b *bundle) orderWithStatus(t testing.TB, id string, amount int64, status string) {
	t.Helper()
	r := b.do(t, "POST", "/v1/orders", b.keyA, "create-"+id, orderBody(id, amount))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	_, err := b.pool.Exec(b.ctx, `UPDATE orders SET status = $3 WHERE tenant_id = $1 AND id = $2`, b.tenantA, id, status)
	require.NoError(t, err)
}

// reserve writes the refund's ledger row, as the Reserve step would.
func (b *bundle) reserve(t testing.TB, orderID, refundID string, amount int64, reason string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO refund_ledger (tenant_id, order_id, refund_id, amount_minor, reason, effect_key)
		VALUES ($1, $2, $3, $4, $5, $6)`, b.tenantA, orderID, refundID, amount, reason,
		b.tenantA+":order:"+orderID+":refund:"+refundID+":refund_reserve")
	require.NoError(t, err)
}

func (b *bundle) refundRows(t testing.TB) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM keyed_outbox WHERE workflow_type = $1`, refunds.WorkflowName)
}

func decodeRefund(t testing.TB, r response) api.RefundView {
	t.Helper()
	var v api.RefundView
	require.NoError(t, json.Unmarshal(r.body, &v), "%s", r.body)
	return v
}

// A refund's life as GET shows it: requested (queued), reserved (its ledger
// row), refunded (Stripe's refund recorded), and in GET /v1/orders/{id}
// with the refunded total.
func TestRefundRequestThenGetIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.paidOrder(t, "ord_1", 1000)
	r := b.do(t, "POST", "/v1/orders/ord_1/refunds", b.keyA, "refund-key-1", refundBody("r1", 500, "damaged"))
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	v := decodeRefund(t, r)
	require.Equal(t, api.RefundView{RefundID: "r1", OrderID: "ord_1", AmountMinor: 500, Currency: "usd", Reason: "damaged",
		State: api.RefundRequested, WorkflowID: "refund:" + b.tenantA + ":ord_1:r1", Start: v.Start, Effects: []api.EffectView{}}, v)
	require.Equal(t, "queued", v.Start.State)
	require.Equal(t, 1, b.refundRows(t), "the refund's start is in the outbox")
	var payload refunds.RefundInput
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT payload FROM keyed_outbox WHERE workflow_id = $1`, v.WorkflowID).Scan(&payload))
	require.Equal(t, refunds.NewInput(b.tenantA, "ord_1", "r1", 500, "damaged"), payload)

	get := func() api.RefundView {
		r := b.do(t, "GET", "/v1/orders/ord_1/refunds/r1", b.keyA, "", "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		return decodeRefund(t, r)
	}
	require.Equal(t, api.RefundRequested, get().State)

	b.reserve(t, "ord_1", "r1", 500, "damaged")
	require.Equal(t, api.RefundReserved, get().State)
	order := func() api.OrderDetail {
		r := b.do(t, "GET", "/v1/orders/ord_1", b.keyA, "", "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var detail api.OrderDetail
		require.NoError(t, json.Unmarshal(r.body, &detail))
		return detail
	}
	inFlight := order()
	require.Zero(t, inFlight.RefundedMinor, "reserved, not refunded at Stripe yet")
	require.EqualValues(t, 500, inFlight.ReservedMinor)

	_, err := b.pool.Exec(b.ctx, `INSERT INTO refund_stripe_outcomes (tenant_id, order_id, refund_id, stripe_refund_id,
		payment_intent_id, status, amount_minor, currency, effect_key) VALUES ($1, 'ord_1', 'r1', 're_1', 'pi_1', 'succeeded', 500, 'usd', $2)`,
		b.tenantA, b.tenantA+":order:ord_1:refund:r1:refund_stripe")
	require.NoError(t, err)
	got := get()
	require.Equal(t, api.RefundRefunded, got.State)
	require.Equal(t, "re_1", got.StripeRefundID)

	detail := order()
	require.Len(t, detail.Refunds, 1)
	require.Equal(t, got.StripeRefundID, detail.Refunds[0].StripeRefundID)
	require.EqualValues(t, 500, detail.RefundedMinor)
	require.EqualValues(t, 500, detail.ReservedMinor)

	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/ord_1/refunds/r2", b.keyA, "", "").status)
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/ord_none/refunds/r1", b.keyA, "", "").status)
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/v1/orders/ord_1/refunds/r1", b.keyB, "", "").status, "another tenant's")
	r = b.do(t, "DELETE", "/v1/orders/ord_1/refunds/r1", b.keyA, "", "")
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "GET, HEAD", r.header.Get("Allow"))
	r = b.do(t, "GET", "/v1/orders/ord_1/refunds", b.keyA, "", "")
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "POST", r.header.Get("Allow"))
}

// The same refund POSTed 20 times under one Idempotency-Key, the first
// eight at once: one outbox row, one stored response, every 2xx identical.
func TestRetriedRefundPostQueuesOneStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.paidOrder(t, "ord_r", 4200)
	body := refundBody("r1", 1200, "late delivery")
	_, replays, _ := retryStorm(t, http.StatusAccepted, func() response {
		return b.do(t, "POST", "/v1/orders/ord_r/refunds", b.keyA, "refund-retry", body)
	})
	require.Equal(t, 19, replays)
	require.Equal(t, 1, b.refundRows(t), "one refund start")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM keyed_effects WHERE kind = $1`, api.KindAPIRequest), "the order's key and the refund's")

	// Relayed: one start of the refund's workflow ID.
	_, err := b.relay(t, nil).Poll(b.ctx)
	require.NoError(t, err)
	wf := refunds.NewInput(b.tenantA, "ord_r", "r1", 1200, "").WorkflowID()
	require.Equal(t, 1, b.starter.count(wf))
	require.True(t, b.workflowExists(t, wf))
}

// The Idempotency-Key's semantics, and the refund ID's: one key with
// another body is 422; the same refund under another key collapses into
// the first (200, nothing written); the same refund ID with another amount
// is 409 refund_conflict.
func TestRefundKeyAndRefundIDSemantics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.paidOrder(t, "ord_s", 1000)
	first := b.do(t, "POST", "/v1/orders/ord_s/refunds", b.keyA, "k1", refundBody("r1", 300, ""))
	require.Equal(t, http.StatusAccepted, first.status, "%s", first.body)
	before := b.rows(t)

	r := b.do(t, "POST", "/v1/orders/ord_s/refunds", b.keyA, "k1", refundBody("r1", 301, ""))
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s", r.body)
	require.Equal(t, api.CodeIdempotencyKeyReused, decodeError(t, r).Code)
	r = b.do(t, "POST", "/v1/orders", b.keyA, "k1", orderBody("ord_s2", 100))
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "a refund's key is not an order's")
	require.Equal(t, before, b.rows(t))

	r = b.do(t, "POST", "/v1/orders/ord_s/refunds", b.keyA, "k2", refundBody("r1", 300, ""))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, decodeRefund(t, first).WorkflowID, decodeRefund(t, r).WorkflowID)
	require.Equal(t, before["keyed_outbox"], b.rows(t)["keyed_outbox"])

	for _, body := range []string{refundBody("r1", 299, ""), refundBody("r1", 300, "other reason")} {
		r = b.do(t, "POST", "/v1/orders/ord_s/refunds", b.keyA, "k3-"+randomID(3), body)
		require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
		e := decodeError(t, r)
		require.Equal(t, api.CodeRefundConflict, e.Code)
		require.Equal(t, "refund_id", e.Field)
	}
	// Once reserved, the ledger row decides, and the order refunded in
	// full still takes a repeat of the refund that emptied it.
	b.reserve(t, "ord_s", "r1", 300, "")
	b.reserve(t, "ord_s", "r0", 700, "")
	_, err := b.pool.Exec(b.ctx, `UPDATE orders SET status = 'refunded' WHERE tenant_id = $1 AND id = 'ord_s'`, b.tenantA)
	require.NoError(t, err)
	r = b.do(t, "POST", "/v1/orders/ord_s/refunds", b.keyA, "k4", refundBody("r1", 300, ""))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, api.RefundReserved, decodeRefund(t, r).State)
	r = b.do(t, "POST", "/v1/orders/ord_s/refunds", b.keyA, "k5", refundBody("r0", 701, ""))
	require.Equal(t, api.CodeRefundConflict, decodeError(t, r).Code)
}

// Refusals answer a stable code and write nothing: no outbox row, no
// stored response, so the same key with a fixed body runs.
func TestRefundRefusalsWriteNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.orderWithStatus(t, "ord_pending", 1000, "pending")
	b.orderWithStatus(t, "ord_failed", 1000, "failed")
	b.orderWithStatus(t, "ord_refunded", 1000, "refunded")
	b.paidOrder(t, "ord_paid", 1000)
	b.reserve(t, "ord_paid", "r0", 600, "")
	before := b.rows(t)
	for _, c := range []struct {
		path, body string
		status     int
		code       string
		field      string
	}{
		{"/v1/orders/ord_none/refunds", refundBody("r1", 100, ""), http.StatusNotFound, api.CodeNotFound, "id"},
		{"/v1/orders/ord_pending/refunds", refundBody("r1", 100, ""), http.StatusConflict, api.CodeOrderNotRefundable, "id"},
		{"/v1/orders/ord_failed/refunds", refundBody("r1", 100, ""), http.StatusConflict, api.CodeOrderNotRefundable, "id"},
		{"/v1/orders/ord_refunded/refunds", refundBody("r1", 100, ""), http.StatusConflict, api.CodeOrderNotRefundable, "id"},
		{"/v1/orders/ord_paid/refunds", refundBody("r1", 401, ""), http.StatusUnprocessableEntity, api.CodeRefundExceedsCharge, "amount_minor"},
		{"/v1/orders/ord_paid/refunds", `{"refund_id":"r1"}`, http.StatusBadRequest, api.CodeMissingField, "amount_minor"},
		{"/v1/orders/ord_paid/refunds", `{"amount_minor":1}`, http.StatusBadRequest, api.CodeMissingField, "refund_id"},
		{"/v1/orders/ord_paid/refunds", `{"refund_id":"r1","amount_minor":1,"tenant_id":"x"}`, http.StatusBadRequest, api.CodeUnknownField, "tenant_id"},
		{"/v1/orders/ord_paid/refunds", `{"refund_id":"r1","amount_minor":1,"Reason":"x"}`, http.StatusBadRequest, api.CodeUnknownField, "Reason"},
		{"/v1/orders/ord_paid/refunds", `{"refund_id":"r1","amount_minor":1,"amount_minor":2}`, http.StatusBadRequest, api.CodeDuplicateField, "amount_minor"},
		{"/v1/orders/ord_paid/refunds", refundBody("r1", 0, ""), http.StatusBadRequest, api.CodeInvalidField, "amount_minor"},
		{"/v1/orders/ord_paid/refunds", `{"refund_id":"r1","amount_minor":"5"}`, http.StatusBadRequest, api.CodeInvalidField, "amount_minor"},
		{"/v1/orders/ord_paid/refunds", refundBody("r:1", 100, ""), http.StatusBadRequest, api.CodeInvalidField, "refund_id"},
		{"/v1/orders/ord_paid/refunds", refundBody("", 100, ""), http.StatusBadRequest, api.CodeInvalidField, "refund_id"},
		{"/v1/orders/ord_paid/refunds", refundBody(strings.Repeat("r", 65), 100, ""), http.StatusBadRequest, api.CodeInvalidField, "refund_id"},
		{"/v1/orders/ord_paid/refunds", refundBody("..", 100, ""), http.StatusBadRequest, api.CodeInvalidField, "refund_id"},
		{"/v1/orders/ord_paid/refunds", refundBody(".", 100, ""), http.StatusBadRequest, api.CodeInvalidField, "refund_id"},
		{"/v1/orders/ord_paid/refunds", refundBody("a/b", 100, ""), http.StatusBadRequest, api.CodeInvalidField, "refund_id"},
		{"/v1/orders/ord_paid/refunds", refundBody("r 1", 100, ""), http.StatusBadRequest, api.CodeInvalidField, "refund_id"},
		{"/v1/orders/ord_paid/refunds", `null`, http.StatusBadRequest, api.CodeInvalidJSON, ""},
		{"/v1/orders/ord_paid/refunds", refundBody("r1", 100, strings.Repeat("x", 201)), http.StatusBadRequest, api.CodeInvalidField, "reason"},
		{"/v1/orders/ord_paid/refunds", `{"refund_id":"r1","amount_minor":100,"reason":"a\u001bb"}`, http.StatusBadRequest, api.CodeInvalidField, "reason"},
		{"/v1/orders/ord_paid/refunds", `{"refund_id":`, http.StatusBadRequest, api.CodeInvalidJSON, ""},
		{"/v1/orders/ord_paid/refunds", "{\"refund_id\":\"r1\",\"amount_minor\":100,\"reason\":\"bad\xff\"}", http.StatusBadRequest, api.CodeInvalidJSON, ""},
		{"/v1/orders/ord_paid/refunds", `{"refund_id":"r1","amount_minor":100,"reason":"a\ud800b"}`, http.StatusBadRequest, api.CodeInvalidJSON, ""},
	} {
		r := b.do(t, "POST", c.path, b.keyA, "k-"+randomID(4), c.body)
		require.Equal(t, c.status, r.status, "%s %s: %s", c.path, c.body, r.body)
		e := decodeError(t, r)
		require.Equal(t, c.code, e.Code, "%s %s: %s", c.path, c.body, r.body)
		require.Equal(t, c.field, e.Field, "%s %s: %s", c.path, c.body, r.body)
	}
	// A long refused value is quoted cut short, not repeated whole.
	r := b.do(t, "POST", "/v1/orders/ord_paid/refunds", b.keyA, "k-long", refundBody(strings.Repeat("r", 600), 100, ""))
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	require.Less(t, len(decodeError(t, r).Message), 200, "%s", r.body)
	require.Contains(t, decodeError(t, r).Message, strings.Repeat("r", 64)+`"...`)
	r = b.do(t, "POST", "/v1/orders/ord_paid/refunds", b.keyA, "", refundBody("r1", 100, ""))
	require.Equal(t, api.CodeMissingIdempotencyKey, decodeError(t, r).Code)
	require.Equal(t, before, b.rows(t), "no refusal writes anything")

	// The exceeding request's key is free: fixed, it runs.
	r = b.do(t, "POST", "/v1/orders/ord_paid/refunds", b.keyA, "k-exceed", refundBody("r1", 401, ""))
	require.Equal(t, api.CodeRefundExceedsCharge, decodeError(t, r).Code)
	require.Contains(t, decodeError(t, r).Message, "1000 charged, 600 refunded or in flight, 400 left")
	r = b.do(t, "POST", "/v1/orders/ord_paid/refunds", b.keyA, "k-exceed", refundBody("r1", 400, ""))
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
}

// A refund whose step failed for good shows failed with the step's stable
// code and a plain message; the stored message never reaches the tenant.
func TestRefundFailureShowsCodesNotDetail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.paidOrder(t, "ord_f", 1000)
	require.Equal(t, http.StatusAccepted, b.do(t, "POST", "/v1/orders/ord_f/refunds", b.keyA, "k", refundBody("r1", 100, "")).status)
	b.reserve(t, "ord_f", "r1", 100, "")
	_, err := b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, error_code, error_message, finished_at)
		VALUES ($1, $2, 'refund_stripe', 'failed_terminal', 'wf/refund_stripe', 'provider_rejected', 'stripe at 10.0.0.7 said charge_already_refunded', now())`,
		b.tenantA+":order:ord_f:refund:r1:refund_stripe", b.tenantA)
	require.NoError(t, err)
	r := b.do(t, "GET", "/v1/orders/ord_f/refunds/r1", b.keyA, "", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	v := decodeRefund(t, r)
	require.Equal(t, api.RefundFailed, v.State)
	require.Equal(t, "provider_rejected", v.ErrorCode)
	require.Equal(t, "this step failed and will not be retried", v.Error)
	require.NotContains(t, string(r.body), "10.0.0.7")
	r = b.do(t, "GET", "/v1/orders/ord_f", b.keyA, "", "")
	require.NotContains(t, string(r.body), "10.0.0.7")
}

// failStep records the refund's step as failed for good with code, as a
// step's record is.
func (b *bundle) failStep(t testing.TB, orderID, refundID, step, code string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, error_code, error_message, finished_at)
		VALUES ($1, $2, $3, 'failed_terminal', 'wf/'||$3, $4, 'detail the tenant never sees', now())`,
		b.tenantA+":order:"+orderID+":refund:"+refundID+":"+step, b.tenantA, step, code)
	require.NoError(t, err)
}

// A refund Stripe refused and keyed released shows failed and released,
// with Stripe's code; it no longer counts in reserved_minor (nor ever did
// in refunded_minor), so the whole
// charge can be refunded again.
func TestReleasedRefundShowsReleased(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.paidOrder(t, "ord_x", 1000)
	require.Equal(t, http.StatusAccepted, b.do(t, "POST", "/v1/orders/ord_x/refunds", b.keyA, "k1", refundBody("r1", 1000, "")).status)
	b.reserve(t, "ord_x", "r1", 1000, "")
	b.failStep(t, "ord_x", "r1", refunds.StepStripe, "provider_rejected")
	_, err := b.pool.Exec(b.ctx, `INSERT INTO refund_releases (tenant_id, order_id, refund_id, amount_minor, code, effect_key)
		VALUES ($1, 'ord_x', 'r1', 1000, 'charge_disputed', $2)`, b.tenantA, b.tenantA+":order:ord_x:refund:r1:refund_release")
	require.NoError(t, err)

	r := b.do(t, "GET", "/v1/orders/ord_x/refunds/r1", b.keyA, "", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	v := decodeRefund(t, r)
	require.Equal(t, api.RefundFailed, v.State)
	require.Equal(t, "provider_rejected", v.ErrorCode)
	require.True(t, v.Released)
	require.Equal(t, "charge_disputed", v.RefusalCode)
	require.Contains(t, string(r.body), `"released":true`)
	require.NotContains(t, string(r.body), "detail the tenant never sees")

	r = b.do(t, "GET", "/v1/orders/ord_x", b.keyA, "", "")
	var detail api.OrderDetail
	require.NoError(t, json.Unmarshal(r.body, &detail))
	require.Zero(t, detail.RefundedMinor)
	require.Zero(t, detail.ReservedMinor)
	r = b.do(t, "POST", "/v1/orders/ord_x/refunds", b.keyA, "k2", refundBody("r2", 1000, ""))
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
}

// A step whose outcome is unknown (its run waits for an operator's
// decision) shows needs_attention with its code; a refusal shows failed.
func TestRefundWaitingForADecisionNeedsAttention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.paidOrder(t, "ord_w", 1000)
	for _, c := range []struct{ refundID, step, code, state string }{
		{"r1", refunds.StepStripe, "key_reused", api.RefundNeedsAttention},
		{"r2", refunds.StepStripe, "ambiguous", api.RefundNeedsAttention},
		{"r3", refunds.StepStripe, "provider_rejected", api.RefundFailed},
		{"r4", refunds.StepReserve, "invalid_state", api.RefundFailed},
	} {
		require.Equal(t, http.StatusAccepted, b.do(t, "POST", "/v1/orders/ord_w/refunds", b.keyA, "k-"+c.refundID, refundBody(c.refundID, 100, "")).status)
		if c.step == refunds.StepStripe {
			b.reserve(t, "ord_w", c.refundID, 100, "")
		}
		b.failStep(t, "ord_w", c.refundID, c.step, c.code)
		r := b.do(t, "GET", "/v1/orders/ord_w/refunds/"+c.refundID, b.keyA, "", "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		v := decodeRefund(t, r)
		require.Equal(t, c.state, v.State, c.code)
		require.Equal(t, c.code, v.ErrorCode)
		require.False(t, v.Released)
	}
}

// statementCount is a pgx.QueryTracer that counts the statements sent.
type statementCount struct{ n atomic.Int64 }

func (c *statementCount) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCount) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// An order's view reads its refunds in a fixed number of statements,
// whatever their number: a refund more costs no round trip.
func TestOrderViewStatementsDoNotGrowWithRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.url)
	require.NoError(t, err)
	counter := &statementCount{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	keys, err := api.ParseKeys(b.keyList)
	require.NoError(t, err)
	h, err := api.NewHandler(pool, keys, &api.HandlerOpts{Logger: b.logger})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	get := func(order string) int64 {
		before := counter.n.Load()
		r := doAt(t, srv.Client(), srv.URL, "GET", "/v1/orders/"+order, b.keyA, "", "")
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		return counter.n.Load() - before
	}
	counts := map[int]int64{}
	for _, n := range []int{1, 30} {
		order := fmt.Sprintf("ord_n%d", n)
		b.paidOrder(t, order, 10_000)
		for i := range n {
			r := b.do(t, "POST", "/v1/orders/"+order+"/refunds", b.keyA, fmt.Sprintf("k-%s-%d", order, i), refundBody(fmt.Sprintf("r%d", i), 1, ""))
			require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
			if i%2 == 0 {
				b.reserve(t, order, fmt.Sprintf("r%d", i), 1, "")
			}
		}
		counts[n] = get(order)
		var view api.OrderDetail
		r := doAt(t, srv.Client(), srv.URL, "GET", "/v1/orders/"+order, b.keyA, "", "")
		require.NoError(t, json.Unmarshal(r.body, &view))
		require.Len(t, view.Refunds, n)
		require.EqualValues(t, (n+1)/2, view.ReservedMinor)
	}
	require.Equal(t, counts[1], counts[30], "statements for an order with 1 refund and with 30")
}

// An order's last places, raced for over HTTP through two API processes
// (this one and a child, as two replicas): refunds.MaxPerOrder requests are
// accepted and every other one gets 422 too_many_refunds. Each process
// queues an order's requests in turn; across them the database lock counts.
func TestRacingRefundsNeverPassTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.paidOrder(t, "ord_1", 100000)
	replica := "http://" + b.startChild(t).addr
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	const extra = 30
	var wg sync.WaitGroup
	got := make([]response, refunds.MaxPerOrder+extra)
	for i := range got {
		wg.Go(func() {
			url := []string{b.srv.URL, replica}[i%2]
			got[i] = sendUntilServed(t, client, url, probe{"POST", "/v1/orders/ord_1/refunds", b.keyA, fmt.Sprintf("race-%d", i),
				refundBody(fmt.Sprintf("r%d", i), 1, ""), 0})
		})
	}
	wg.Wait()
	statuses := map[int]int{}
	for _, r := range got {
		statuses[r.status]++
		if r.status == http.StatusUnprocessableEntity {
			require.Contains(t, string(r.body), api.CodeTooManyRefunds)
		}
	}
	require.Equal(t, map[int]int{http.StatusAccepted: refunds.MaxPerOrder, http.StatusUnprocessableEntity: extra}, statuses)
	require.Equal(t, refunds.MaxPerOrder, b.refundRows(t))
}

// A refund refused at Reserve, after the request's own check let it
// through (two refunds that each fit alone), says why in plain words,
// with the step's code; the stored message stays inside.
func TestRefundRefusedAtReserveSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.paidOrder(t, "ord_r", 1000)
	require.Equal(t, http.StatusAccepted, b.do(t, "POST", "/v1/orders/ord_r/refunds", b.keyA, "k", refundBody("r1", 600, "")).status)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, error_code, error_message, finished_at)
		VALUES ($1, $2, $3, 'failed_terminal', 'wf/refund_reserve', $4, 'refund of 6.00 exceeds what is left of the charge: 10.00 charged, 6.00 refunded or in flight, 4.00 left', now())`,
		b.tenantA+":order:ord_r:refund:r1:"+refunds.StepReserve, b.tenantA, refunds.StepReserve, step.CodeInvalidState)
	require.NoError(t, err)
	r := b.do(t, "GET", "/v1/orders/ord_r/refunds/r1", b.keyA, "", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	v := decodeRefund(t, r)
	require.Equal(t, api.RefundFailed, v.State)
	require.Equal(t, step.CodeInvalidState, v.ErrorCode)
	require.Contains(t, v.Error, "no longer fit in what was left of the charge")
	require.NotContains(t, string(r.body), "4.00 left")
}
