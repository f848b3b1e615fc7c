package refunds_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

// requestSetup gives a test its schema, an order store and a 10.00 USD
// order in each status it names.
const tenant = "acme"

func requestSetup(t *testing.T, statuses map[string]orders.Status) (*pgxpool.Pool, *orders.Store) {
	t.Helper()
	pool := dbtest.NewPool(t)
	store, err := orders.NewStore(pool)
	require.NoError(t, err)
	ctx := context.Background()
	for id, st := range statuses {
		_, _, err := store.Create(ctx, orders.NewOrder{TenantID: tenant, ID: id, AmountMinor: 1000, Currency: "usd",
			CustomerEmail: "ada@example.com", PaymentMethod: "pm_card_visa"})
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE orders SET status = $3 WHERE tenant_id = $1 AND id = $2`, tenant, id, st)
		require.NoError(t, err)
	}
	return pool, store
}

func request(t *testing.T, pool *pgxpool.Pool, store *orders.Store, in refunds.RefundInput) (bool, error) {
	t.Helper()
	var created bool
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		_, created, err = refunds.RequestTx(context.Background(), tx, store, in)
		return err
	})
	return created, err
}

func TestRequestTxQueuesARefundOnceAndRefusesWhatCannotRun(t *testing.T) {
	t.Parallel()
	pool, store := requestSetup(t, map[string]orders.Status{"paid": orders.StatusPaid, "pending": orders.StatusPending,
		"failed": orders.StatusFailed, "refunded": orders.StatusRefunded})
	ctx := context.Background()
	r1 := refunds.NewInput(tenant, "paid", "r1", 500, "damaged")
	created, err := request(t, pool, store, r1)
	require.NoError(t, err)
	require.True(t, created)
	created, err = request(t, pool, store, r1)
	require.NoError(t, err)
	require.False(t, created, "the same refund again collapses")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_outbox WHERE workflow_id = $1`, r1.WorkflowID()).Scan(&n))
	require.Equal(t, 1, n)

	_, err = request(t, pool, store, refunds.NewInput(tenant, "paid", "r1", 400, "damaged"))
	require.ErrorIs(t, err, refunds.ErrConflict)
	_, err = request(t, pool, store, refunds.NewInput(tenant, "paid", "r1", 500, "other"))
	require.ErrorIs(t, err, refunds.ErrConflict)
	_, err = request(t, pool, store, refunds.NewInput(tenant, "paid", "r2", 1001, ""))
	var exceeds *refunds.ExceedsError
	require.ErrorAs(t, err, &exceeds)
	require.Equal(t, refunds.ExceedsError{AmountMinor: 1001, ChargedMinor: 1000}, *exceeds)
	for _, id := range []string{"pending", "failed", "refunded"} {
		_, err = request(t, pool, store, refunds.NewInput(tenant, id, "r1", 1, ""))
		require.ErrorIs(t, err, refunds.ErrNotRefundable, id)
	}
	_, err = request(t, pool, store, refunds.NewInput(tenant, "none", "r1", 1, ""))
	require.ErrorIs(t, err, orders.ErrNotFound)
	_, err = request(t, pool, store, refunds.NewInput(tenant, "paid", "r3", 0, ""))
	require.ErrorIs(t, err, step.ErrInvalidInput)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_outbox`).Scan(&n))
	require.Equal(t, 1, n, "refusals queue nothing")

	// Reserved, the ledger counts: what is left shrinks.
	_, err = pool.Exec(ctx, `INSERT INTO refund_ledger (tenant_id, order_id, refund_id, amount_minor, reason, effect_key)
		VALUES ($1, 'paid', 'r1', 500, 'damaged', 'k1')`, tenant)
	require.NoError(t, err)
	_, err = request(t, pool, store, refunds.NewInput(tenant, "paid", "r2", 501, ""))
	require.ErrorAs(t, err, &exceeds)
	require.EqualValues(t, 500, exceeds.RefundedMinor)
	created, err = request(t, pool, store, refunds.NewInput(tenant, "paid", "r2", 500, ""))
	require.NoError(t, err)
	require.True(t, created)

	ledger, err := refunds.NewLedger(pool)
	require.NoError(t, err)
	all, err := ledger.Refunds(ctx, tenant, "paid")
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, "r1", all[0].RefundID)
	require.NotNil(t, all[0].Entry, "r1 is reserved")
	require.Equal(t, "r2", all[1].RefundID)
	require.Nil(t, all[1].Entry, "r2 is only requested")
	_, err = ledger.Refund(ctx, tenant, "paid", "r9")
	require.ErrorIs(t, err, refunds.ErrNotFound)
}

// Concurrent requests of one refund ID, half with another amount: one
// start is queued, every request of its amount collapses into it, and
// every other is a conflict.
func TestConcurrentRequestsOfOneRefundQueueOneStart(t *testing.T) {
	t.Parallel()
	pool, store := requestSetup(t, map[string]orders.Status{"o": orders.StatusPaid})
	var (
		mu                        sync.Mutex
		created, joined, conflict = map[int64]int{}, map[int64]int{}, map[int64]int{}
		wg                        sync.WaitGroup
	)
	for i := range 10 {
		amount := int64(100 + i%2)
		wg.Go(func() {
			c, err := request(t, pool, store, refunds.NewInput(tenant, "o", "r1", amount, ""))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, refunds.ErrConflict):
				conflict[amount]++
			case err != nil:
				t.Error(err)
			case c:
				created[amount]++
			default:
				joined[amount]++
			}
		})
	}
	wg.Wait()
	require.Len(t, created, 1, "one start queued")
	for winner := range created {
		require.Equal(t, 1, created[winner])
		require.Equal(t, 4, joined[winner])
		require.Equal(t, 5, conflict[201-winner], "the other amount conflicts")
	}
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM keyed_outbox`).Scan(&n))
	require.Equal(t, 1, n)
}

// An order's queued refunds are read through the outbox's refund index, not
// a scan of every outbox row (sent rows stay for days), also as the
// generic plan a session keeps.
func TestQueuedRefundsReadTheRefundIndex(t *testing.T) {
	t.Parallel()
	pool, store := requestSetup(t, map[string]orders.Status{"o1": orders.StatusPaid})
	ctx := context.Background()
	_, err := request(t, pool, store, refunds.NewInput(tenant, "o1", "r1", 100, ""))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO keyed_outbox (workflow_type, workflow_id, payload, tenant_id, sent_at)
SELECT 'OrderWorkflow', 'order:x:' || i || ':fulfil', jsonb_build_object('tenant_id', 'x', 'order_id', i::text), 'x', now()
FROM generate_series(1, 20000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE keyed_outbox`)
	require.NoError(t, err)

	ledger, err := refunds.NewLedger(pool)
	require.NoError(t, err)
	refs, err := ledger.Refunds(ctx, tenant, "o1")
	require.NoError(t, err)
	require.Len(t, refs, 1)
	require.Equal(t, "r1", refs[0].RefundID)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `PREPARE queued (text, text) AS `+refunds.QueuedRefundsSQL)
	require.NoError(t, err)
	rows, err := conn.Query(ctx, `EXPLAIN (COSTS OFF) EXECUTE queued ('acme', 'o1')`)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `DEALLOCATE queued; RESET plan_cache_mode`)
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "keyed_outbox_refunds_idx", plan)
	require.NotContains(t, plan, "Seq Scan", plan)
}

// An order takes at most MaxPerOrder refunds, counted once each whether
// only requested or in the ledger; the same refund asked again still
// answers as before.
func TestRequestTxRefusesARefundPastTheMostAnOrderMayHave(t *testing.T) {
	t.Parallel()
	pool, store := requestSetup(t, map[string]orders.Status{"o1": orders.StatusPaid})
	ctx := context.Background()
	half := refunds.MaxPerOrder / 2
	for i := range half {
		created, err := request(t, pool, store, refunds.NewInput(tenant, "o1", fmt.Sprintf("q%d", i), 1, ""))
		require.NoError(t, err)
		require.True(t, created)
	}
	// The first half reserved, as Reserve writes them: each counts once.
	_, err := pool.Exec(ctx, `INSERT INTO refund_ledger (tenant_id, order_id, refund_id, amount_minor, effect_key)
SELECT $1, 'o1', 'q' || i, 1, $1 || ':order:o1:refund:q' || i || ':refund_reserve' FROM generate_series(0, $2 - 1) i`, tenant, half/2)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO refund_ledger (tenant_id, order_id, refund_id, amount_minor, effect_key)
SELECT $1, 'o1', 'l' || i, 1, $1 || ':order:o1:refund:l' || i || ':refund_reserve' FROM generate_series(1, $2) i`, tenant, refunds.MaxPerOrder-half)
	require.NoError(t, err)

	_, err = request(t, pool, store, refunds.NewInput(tenant, "o1", "one-more", 1, ""))
	require.ErrorIs(t, err, refunds.ErrTooManyRefunds)
	created, err := request(t, pool, store, refunds.NewInput(tenant, "o1", "q0", 1, ""))
	require.NoError(t, err, "the same refund asked again")
	require.False(t, created)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM keyed_outbox WHERE payload->>'refund_id' = 'one-more'`).Scan(&n))
	require.Zero(t, n, "a refused request queues nothing")
}

// Requests racing for an order's last places get MaxPerOrder between them:
// the count is taken under the order's lock.
func TestConcurrentRequestsNeverPassTheMostAnOrderMayHave(t *testing.T) {
	t.Parallel()
	pool, store := requestSetup(t, map[string]orders.Status{"o1": orders.StatusPaid})
	extra := 20
	var (
		created, refused atomic.Int64
		wg               sync.WaitGroup
	)
	for i := range refunds.MaxPerOrder + extra {
		wg.Go(func() {
			c, err := request(t, pool, store, refunds.NewInput(tenant, "o1", fmt.Sprintf("r%d", i), 1, ""))
			switch {
			case errors.Is(err, refunds.ErrTooManyRefunds):
				refused.Add(1)
			case err != nil:
				t.Error(err)
			case c:
				created.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, refunds.MaxPerOrder, created.Load())
	require.EqualValues(t, extra, refused.Load())
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM keyed_outbox`).Scan(&n))
	require.Equal(t, refunds.MaxPerOrder, n)
}
