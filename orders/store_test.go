package orders_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/step"
)

type bundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	store *orders.Store
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := dbtest.NewPool(t)
	store, err := orders.NewStore(pool)
	require.NoError(t, err)
	return &bundle{ctx: context.Background(), pool: pool, store: store}
}

func valid() orders.NewOrder {
	return orders.NewOrder{TenantID: "acme", ID: "9f3a", AmountMinor: 1250, Currency: "eur",
		CustomerEmail: "ada@example.com", PaymentMethod: "pm_card_visa"}
}

func TestCreateIsRetrySafe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o, created, err := b.store.Create(b.ctx, valid())
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, orders.StatusPending, o.Status)

	again, created, err := b.store.Create(b.ctx, valid())
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, o.CreatedAt, again.CreatedAt)

	other := valid()
	other.AmountMinor = 999
	_, _, err = b.store.Create(b.ctx, other)
	require.ErrorIs(t, err, orders.ErrConflict)

	// The same order ID under another tenant is another order.
	globex := valid()
	globex.TenantID = "globex"
	_, created, err = b.store.Create(b.ctx, globex)
	require.NoError(t, err)
	require.True(t, created)
}

func TestValidateNamesTheField(t *testing.T) {
	t.Parallel()
	for field, mut := range map[string]func(*orders.NewOrder){
		"tenant_id":      func(o *orders.NewOrder) { o.TenantID = "" },
		"order_id":       func(o *orders.NewOrder) { o.ID = "a:b" },
		"amount_minor":   func(o *orders.NewOrder) { o.AmountMinor = 0 },
		"currency":       func(o *orders.NewOrder) { o.Currency = "EUR" },
		"customer_email": func(o *orders.NewOrder) { o.CustomerEmail = "Ada <ada@example.com>" },
		"payment_method": func(o *orders.NewOrder) { o.PaymentMethod = "4242424242424242" },
	} {
		o := valid()
		mut(&o)
		var ve *orders.ValidationError
		require.ErrorAs(t, o.Validate(), &ve, field)
		require.Equal(t, field, ve.Field)
		require.ErrorIs(t, ve, orders.ErrInvalid)
	}
	require.NoError(t, valid().Validate())
}

// An order ID names one segment of GET /v1/orders/{id}: no "/", not only
// dots, which a router would clean away.
func TestValidateOrderIDIsOnePathSegment(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"a/b", "/", ".", "..", "..."} {
		o := valid()
		o.ID = id
		var ve *orders.ValidationError
		require.ErrorAs(t, o.Validate(), &ve, id)
		require.Equal(t, "order_id", ve.Field, id)
	}
	for _, id := range []string{"a.b", ".a", "a..", "9f3a"} {
		o := valid()
		o.ID = id
		require.NoError(t, o.Validate(), id)
	}
}

func TestTransitionIsUniquePerEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, _, err := b.store.Create(b.ctx, valid())
	require.NoError(t, err)
	move := func(event string) (bool, error) {
		var changed bool
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			changed, err = b.store.TransitionTx(b.ctx, tx, "acme", "9f3a", orders.StatusPending, orders.StatusPaid, event)
			return err
		})
		return changed, err
	}
	changed, err := move("acme:order:9f3a:mark_paid")
	require.NoError(t, err)
	require.True(t, changed)
	changed, err = move("acme:order:9f3a:mark_paid")
	require.NoError(t, err)
	require.False(t, changed, "the same event moves the order once")
	_, err = move("another-event")
	require.ErrorIs(t, err, orders.ErrBadTransition)

	o, err := b.store.Get(b.ctx, "acme", "9f3a")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, o.Status)
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM order_transitions`).Scan(&n))
	require.Equal(t, 1, n)

	_, err = b.store.Get(b.ctx, "globex", "9f3a")
	require.ErrorIs(t, err, orders.ErrNotFound)
}

func TestOrderInput(t *testing.T) {
	t.Parallel()
	in := orders.NewOrderInput("acme", "9f3a")
	require.NoError(t, in.Validate())
	require.Equal(t, "order:acme:9f3a:fulfil", in.WorkflowID())
	k, err := in.EffectKey(orders.StepCharge)
	require.NoError(t, err)
	require.Equal(t, "acme:order:9f3a:charge", k.String())
	in.V = 2
	require.ErrorIs(t, in.Validate(), step.ErrUnsupportedVersion)
	require.ErrorContains(t, orders.OrderInput{V: 1, TenantID: "acme", OrderID: ""}.Validate(), "invalid effect key")
}

func TestTransitionRacersOnOneEventMoveTheOrderOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, _, err := b.store.Create(b.ctx, valid())
	require.NoError(t, err)
	const racers = 32
	changed := make(chan bool, racers)
	var wg sync.WaitGroup
	for range racers {
		wg.Go(func() {
			c, err := b.store.Transition(b.ctx, "acme", "9f3a", orders.StatusPending, orders.StatusPaid, "acme:order:9f3a:mark_paid", nil)
			assert.NoError(t, err, "a racer on the same event is a repeat, not a refusal")
			changed <- c
		})
	}
	wg.Wait()
	close(changed)
	n := 0
	for c := range changed {
		if c {
			n++
		}
	}
	require.Equal(t, 1, n, "one racer moves the order")
	_, err = b.store.Transition(b.ctx, "acme", "9f3a", orders.StatusPending, orders.StatusPaid, "another-event", nil)
	require.ErrorIs(t, err, orders.ErrBadTransition)
	require.ErrorContains(t, err, "the order is paid")
	_, err = b.store.Transition(b.ctx, "acme", "nope", orders.StatusPending, orders.StatusPaid, "acme:order:nope:mark_paid", nil)
	require.ErrorIs(t, err, orders.ErrNotFound)
	var rows int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM order_transitions`).Scan(&rows))
	require.Equal(t, 1, rows, "no transition row without the order's update")
}

func TestTransitionHappensOnlyUnderItsGuard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, _, err := b.store.Create(b.ctx, valid())
	require.NoError(t, err)
	guard := func(ok bool) *orders.Guard { return &orders.Guard{SQL: "$6::boolean", Arg: ok} }
	_, err = b.store.Transition(b.ctx, "acme", "9f3a", orders.StatusPending, orders.StatusPaid, "e1", guard(false))
	require.ErrorIs(t, err, orders.ErrUnguarded)
	o, err := b.store.Get(b.ctx, "acme", "9f3a")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPending, o.Status, "an unmet guard changes nothing")
	changed, err := b.store.Transition(b.ctx, "acme", "9f3a", orders.StatusPending, orders.StatusPaid, "e1", guard(true))
	require.NoError(t, err)
	require.True(t, changed)
	changed, err = b.store.Transition(b.ctx, "acme", "9f3a", orders.StatusPending, orders.StatusPaid, "e1", guard(false))
	require.NoError(t, err, "a repeat finds its transition whatever the guard says now")
	require.False(t, changed)
}
