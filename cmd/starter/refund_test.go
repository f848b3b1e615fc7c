package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
)

func TestRefundBadInputExitsTwoAndWritesNothing(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	env := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"refund", "--tenant", "acme", "--order", "o1"}, "missing --refund, --amount"},
		{[]string{"refund", "--tenant", "acme", "--order", "o1", "--refund", "r1", "--amount", "0"}, "amount_minor 0 is not in 1..99999999"},
		{[]string{"refund", "--tenant", "acme", "--order", "o1", "--refund", "r:1", "--amount", "5"}, "invalid --tenant, --order, --refund"},
		{[]string{"refund", "--tenant", "acme", "--order", "o1", "--refund", "r1", "--amount", "5", "--reason", "a\x1bb"}, "reason holds the character U+001B"},
		{[]string{"refund", "--tenant", "acme", "--order", "o1", "--refund", "r1", "--amount", "x"}, `invalid value "x" for flag --amount`},
	} {
		code, out, errOut := starter(t, env, c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, "%v", c.args)
		require.Empty(t, out)
	}
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM keyed_outbox`).Scan(&n))
	require.Zero(t, n, "bad input queues nothing")
}

// refund against a worker: a partial refund runs once (a repeat collapses),
// a changed amount and an amount over what is left are refused with exit 2,
// and show lists the refund.
func TestRefundThenShowAgainstAWorker(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, nil)
	env := map[string]string{}
	for _, k := range []string{"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_TASK_QUEUE"} {
		env[k] = w.Env[k]
	}
	code, _, errOut := starter(t, env, "create", "--tenant", "acme", "--order", "cli-r", "--amount", "2500", "--currency", "eur",
		"--email", "bob@example.com", "--payment-method", "pm_card_visa")
	require.Equal(t, 0, code, errOut)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, w.Client.GetWorkflow(ctx, orders.WorkflowID("acme", "cli-r"), "").Get(ctx, nil))

	refund := []string{"refund", "--tenant", "acme", "--order", "cli-r", "--refund", "r1", "--amount", "500", "--reason", "damaged"}
	code, out, errOut := starter(t, env, append(refund, "--json")...)
	require.Equal(t, 0, code, errOut)
	var res refundResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, refundResult{TenantID: "acme", OrderID: "cli-r", RefundID: "r1", AmountMinor: 500, Currency: "eur",
		Requested: true, WorkflowID: "refund:acme:cli-r:r1", RunID: res.RunID, Start: "new"}, res)
	require.NotEmpty(t, res.RunID)
	require.NoError(t, w.Client.GetWorkflow(ctx, res.WorkflowID, "").Get(ctx, nil))
	require.Equal(t, 1, w.Stripe.Refunds())

	code, out, errOut = starter(t, env, refund...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "r1 of order acme/cli-r  5.00 EUR  (already requested)")
	require.Contains(t, out, "workflow ID  refund:acme:cli-r:r1")
	require.Contains(t, out, "collapsed into existing run")
	require.Equal(t, 1, w.Stripe.Refunds(), "a repeat refunds nothing")

	code, _, errOut = starter(t, env, "refund", "--tenant", "acme", "--order", "cli-r", "--refund", "r1", "--amount", "501", "--reason", "damaged")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "requested with another amount or reason")
	code, _, errOut = starter(t, env, "refund", "--tenant", "acme", "--order", "cli-r", "--refund", "r2", "--amount", "2001")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "2500 charged, 500 refunded or in flight, 2000 left")
	code, _, errOut = starter(t, env, "refund", "--tenant", "acme", "--order", "nope", "--refund", "r1", "--amount", "1")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "order not found")
	var queued int
	require.NoError(t, w.Pool.QueryRow(ctx, `SELECT count(*) FROM keyed_outbox WHERE workflow_type = $1`, refunds.WorkflowName).Scan(&queued))
	require.Equal(t, 1, queued, "refusals queue nothing")

	require.Eventually(t, func() bool {
		code, out, errOut = starter(t, env, "show", "--tenant", "acme", "--order", "cli-r", "--json")
		require.Equal(t, 0, code, errOut)
		var shown showResult
		require.NoError(t, json.Unmarshal([]byte(out), &shown), out)
		return shown.Order.Status == orders.StatusPartiallyRefunded && len(shown.Refunds) == 1 &&
			shown.Refunds[0].State == "refunded" && shown.RefundedMinor == 500
	}, 30*time.Second, 200*time.Millisecond, out)
	code, out, errOut = starter(t, env, "show", "--tenant", "acme", "--order", "cli-r")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{"status          partially_refunded", "refunds (1, 500 eur refunded)", "r1      500     refunded", "damaged",
		"acme:order:cli-r:refund:r1:refund_stripe"} {
		require.Contains(t, out, want)
	}
}

// paidOrderSchema gives a test a schema of its own with keyed's
// migrations and a paid 9.00 USD order acme/o1, and returns a pool on it
// and its URL for the starter.
func paidOrderSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	ctx := context.Background()
	store, err := orders.NewStore(pool)
	require.NoError(t, err)
	_, _, err = store.Create(ctx, orders.NewOrder{TenantID: "acme", ID: "o1", AmountMinor: 900, Currency: "usd",
		CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE tenant_id = 'acme' AND id = 'o1'`)
	require.NoError(t, err)
	return pool, url
}

// With Temporal unreachable the refund is still queued, in the outbox, for
// the worker's relay: refund says so and succeeds.
func TestRefundIsQueuedWhenTemporalIsDown(t *testing.T) {
	t.Parallel()
	pool, url := paidOrderSchema(t)
	ctx := context.Background()
	env := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
	began := time.Now()
	code, out, errOut := starter(t, env, "refund", "--tenant", "acme", "--order", "o1", "--refund", "r1", "--amount", "900", "--json")
	require.Equal(t, 0, code, errOut)
	t.Logf("refund with Temporal down answered in %s", time.Since(began).Round(time.Millisecond))
	var res refundResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, "queued", res.Start)
	require.True(t, res.Requested)
	require.Contains(t, res.StartError, "127.0.0.1:1")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_outbox WHERE workflow_id = 'refund:acme:o1:r1'`).Scan(&n))
	require.Equal(t, 1, n)
}

// A refund of an order that has refunds.MaxPerOrder already is the
// operator's input refused: exit 2, a plain reason, nothing queued.
func TestRefundPastTheCapExitsTwo(t *testing.T) {
	t.Parallel()
	pool, url := paidOrderSchema(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO refund_ledger (tenant_id, order_id, refund_id, amount_minor, effect_key)
SELECT 'acme', 'o1', 'l' || i, 1, 'acme:order:o1:refund:l' || i || ':refund_reserve' FROM generate_series(1, $1) i`, refunds.MaxPerOrder)
	require.NoError(t, err)
	env := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
	code, out, errOut := starter(t, env, "refund", "--tenant", "acme", "--order", "o1", "--refund", "r1", "--amount", "1")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, fmt.Sprintf("order acme/o1 has %d refunds, the most one order may have", refunds.MaxPerOrder))
	require.Empty(t, out)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_outbox`).Scan(&n))
	require.Zero(t, n)
}

// show's refunded total counts only refunds Stripe confirmed, and names
// what is reserved and still in flight beside it.
func TestShowRefundsNamesWhatIsInFlight(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	res := showResult{Order: &orders.Order{Currency: "eur"}, Refunds: []shownRefund{
		{Refund: refunds.Refund{RefundID: "r1", AmountMinor: 500}, State: "reserved"},
		{Refund: refunds.Refund{RefundID: "r2", AmountMinor: 750}, State: "refunded"},
	}, RefundedMinor: 750, ReservedMinor: 1250}
	require.NoError(t, printRefunds(&out, res))
	require.Contains(t, out.String(), "refunds (2, 750 eur refunded, 500 in flight)")
	res.ReservedMinor = 750
	out.Reset()
	require.NoError(t, printRefunds(&out, res))
	require.Contains(t, out.String(), "refunds (2, 750 eur refunded)\n")
}

// A refund with no ledger row shows refused, with its code, once its
// reserve failed for good, and requested until then.
func TestShowsARefundRefusedAtItsReserve(t *testing.T) {
	t.Parallel()
	o := &orders.Order{TenantID: "acme", ID: "9f3a"}
	reserve := effects.MustKey("acme", "order", "9f3a", "refund", "r1", refunds.StepReserve).String()
	require.Equal(t, "requested", refusedAtReserve(nil, o, "r1"))
	recs := []*effects.Record{{Key: reserve, State: effects.StateFailedTransient, ErrorCode: "transient"}}
	require.Equal(t, "requested", refusedAtReserve(recs, o, "r1"), "a transient failure is retried")
	recs[0].State, recs[0].ErrorCode = effects.StateFailedTerminal, "refund_exceeds_charge"
	require.Equal(t, "refused (refund_exceeds_charge)", refusedAtReserve(recs, o, "r1"))
	require.Equal(t, "requested", refusedAtReserve(recs, o, "r2"))
}
