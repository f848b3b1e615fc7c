package orders_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/orders"
)

// An order's effects are its records plus, for a self-guarded step, the
// transition under its key; a transition outranks an older worker's
// unfinished claim of that key; another tenant's order shows nothing.
func TestEffectsShowASelfGuardedStepsTransition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	claims := effectstest.NewClient(t, b.pool, nil)
	_, _, err := b.store.Create(b.ctx, valid())
	require.NoError(t, err)
	other := valid()
	other.ID = "7b2c"
	_, _, err = b.store.Create(b.ctx, other)
	require.NoError(t, err)
	charge := effects.MustKey("acme", "order", "9f3a", "charge")
	cl, err := claims.Claim(b.ctx, effects.ClaimParams{Key: charge, Owner: "wf/charge"})
	require.NoError(t, err)
	require.NoError(t, claims.Complete(b.ctx, cl, map[string]string{"payment_intent_id": "pi_1"}))
	_, err = b.store.Transition(b.ctx, "acme", "9f3a", orders.StatusPending, orders.StatusPaid, "acme:order:9f3a:mark_paid",
		&orders.Guard{SQL: effects.SucceededSQL(6, "charge"), Arg: charge.String()})
	require.NoError(t, err)
	stale := effects.MustKey("acme", "order", "7b2c", "mark_paid")
	_, err = claims.Claim(b.ctx, effects.ClaimParams{Key: stale, Owner: "wf/mark_paid"})
	require.NoError(t, err)
	_, err = b.store.Transition(b.ctx, "acme", "7b2c", orders.StatusPending, orders.StatusPaid, stale.String(), nil)
	require.NoError(t, err)

	states := func(order string) map[string]string {
		recs, err := b.store.Effects(b.ctx, claims, effects.MustKey("acme", "order", order))
		require.NoError(t, err)
		out := map[string]string{}
		for _, r := range recs {
			out[r.Kind] = string(r.State) + " " + string(r.Result)
		}
		return out
	}
	require.Equal(t, map[string]string{"charge": `succeeded {"payment_intent_id": "pi_1"}`, "mark_paid": `succeeded {"status":"paid"}`}, states("9f3a"))
	require.Equal(t, map[string]string{"mark_paid": `succeeded {"status":"paid"}`}, states("7b2c"), "the transition outranks a stale claim")
	recs, err := b.store.Effects(b.ctx, claims, effects.MustKey("globex", "order", "9f3a"))
	require.NoError(t, err)
	require.Empty(t, recs)
}
