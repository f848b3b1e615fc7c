package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// With a listener, a relay whose poll interval is an hour still starts a
// committed order at once; a rolled-back enqueue wakes nobody.
func TestListenWakesTheRelayOnCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	wake := b.listen(ctx, t)

	rollback := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, _, err := b.store.CreateAndEnqueueTx(b.ctx, tx, b.newOrder("rolled-back"))
		require.NoError(t, err)
		return context.Canceled
	})
	require.ErrorIs(t, rollback, context.Canceled)
	select {
	case <-wake:
		t.Fatal("a rolled-back enqueue must not wake the relay")
	case <-time.After(300 * time.Millisecond):
	}

	r := b.relay(t, &outbox.RelayOpts{PollInterval: time.Hour, Wake: wake})
	go func() { _ = r.Run(ctx) }()
	// Let the relay's first poll (of an empty outbox) pass.
	time.Sleep(300 * time.Millisecond)

	ids := b.createOrders(t, 1)
	require.Eventually(t, func() bool { return b.unsent(t) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the committed order was not started before the hour-long poll")
	b.requireOneRunEach(t, ids)
	calls, _ := b.starter.counts()
	require.Equal(t, 1, calls[orders.WorkflowID(b.tenant, ids[0])])
}

// Enqueues from one process within NotifyWindow notify once; the relay's
// looks after the wake-up start the rows of those that did not, with the
// poll an hour away. Two transactions enqueue a statement apart, so the
// second does not notify; it commits while the relay, woken by the first,
// starts the first, after the claim that found it.
func TestEnqueuesThatDidNotNotifyStillStartAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	second, committed := make(chan pgx.Tx, 1), make(chan error, 1)
	starter := outbox.StarterFunc(func(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
		select {
		case tx := <-second:
			committed <- tx.Commit(b.ctx)
		default:
		}
		return b.starter.Start(ctx, req)
	})
	r, err := outbox.NewRelay(b.pool, starter, &outbox.RelayOpts{PollInterval: time.Hour, Wake: b.listen(ctx, t), Logger: b.logger})
	require.NoError(t, err)
	go func() { _ = r.Run(ctx) }()
	time.Sleep(300 * time.Millisecond) // the relay's first poll, of an empty outbox

	ids := []string{"first", "second"}
	var txs []pgx.Tx
	var made []*orders.Order
	for _, id := range ids {
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(b.ctx) }()
		o, _, err := b.store.CreateTx(b.ctx, tx, b.newOrder(id))
		require.NoError(t, err)
		txs, made = append(txs, tx), append(made, o)
	}
	for i, tx := range txs {
		_, err := orders.EnqueueTx(b.ctx, tx, orders.NewOrderInput(b.tenant, ids[i]), made[i])
		require.NoError(t, err)
	}
	second <- txs[1]
	require.NoError(t, txs[0].Commit(b.ctx))
	select {
	case err := <-committed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the first commit did not wake the relay")
	}
	require.Eventually(t, func() bool { return b.unsent(t) == 0 }, 10*time.Second, 20*time.Millisecond,
		"both orders start before the hour-long poll")
	b.requireOneRunEach(t, ids)
}

// A schema name of 63 bytes, Postgres's longest, still gives a channel
// within the limit: creates commit, the listener wakes the relay, and a
// plain LISTEN on Channel(schema) hears the same notification.
func TestLongSchemaNameStillWakesTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	schema := longSchema(t)
	require.Len(t, schema, 63)
	b.pool = dbtest.Connect(t, effectstest.WithSearchPath(effectstest.DatabaseURL(), schema), &effectstest.PoolOpts{MaxConns: 8})
	store, err := orders.NewStore(b.pool)
	require.NoError(t, err)
	b.store = store
	require.LessOrEqual(t, len(outbox.Channel(schema)), 63)

	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	wake := b.listen(ctx, t)
	plain, err := pgx.Connect(b.ctx, effectstest.DatabaseURL())
	require.NoError(t, err)
	defer plain.Close(b.ctx)
	_, err = plain.Exec(b.ctx, "LISTEN "+pgx.Identifier{outbox.Channel(schema)}.Sanitize())
	require.NoError(t, err)

	ids := b.createOrders(t, 1)
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("the commit did not wake the relay")
	}
	waitCtx, waitCancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer waitCancel()
	n, err := plain.WaitForNotification(waitCtx)
	require.NoError(t, err, "a LISTEN on outbox.Channel(schema) hears the commit")
	require.Equal(t, outbox.Channel(schema), n.Channel)

	sent, err := b.relay(t, nil).Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, sent)
	b.requireOneRunEach(t, ids)
}

func TestChannelIsBoundedAndPerSchema(t *testing.T) {
	t.Parallel()
	require.Equal(t, "keyed_outbox.4c9184f37cff01bcdc32dc486ec36961", outbox.Channel("public"))
	require.NotEqual(t, outbox.Channel("a"), outbox.Channel("b"))
	require.Len(t, outbox.Channel(strings.Repeat("x", 63)), 45)
}

// longSchema creates a schema whose name is 63 bytes long and drops it when
// the test ends.
func longSchema(t *testing.T) string {
	t.Helper()
	schema := "keyed_test_long_" + randomID(4)
	schema += strings.Repeat("x", 63-len(schema))
	conn, err := pgx.Connect(context.Background(), effectstest.DatabaseURL())
	require.NoError(t, err, "connect to Postgres at DATABASE_URL (start it with `make postgres`)")
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), effectstest.DatabaseURL())
		if err != nil {
			t.Logf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// listen runs outbox.Listen on b.pool until ctx ends and returns its wake
// channel once the listener's first wake-up has said it is listening.
func (b *bundle) listen(ctx context.Context, t *testing.T) chan struct{} {
	t.Helper()
	wake := make(chan struct{}, 1)
	go outbox.Listen(ctx, b.pool, wake, b.logger)
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("listener never started")
	}
	return wake
}
