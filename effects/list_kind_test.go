package effects_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

func TestListKindReturnsOneKindInTheWindowAcrossTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	from := time.Now().UTC().Truncate(24 * time.Hour).Add(-5*24*time.Hour + 12*time.Hour)
	_, err := b.client.EnsureLeaves(b.ctx, 7*24*time.Hour, 0)
	require.NoError(t, err)
	to := from.Add(24 * time.Hour)
	at := func(key effects.Key, created time.Time) {
		t.Helper()
		cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "test"})
		require.NoError(t, err)
		require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "pi_" + key.Parts()[1]}))
		_, err = b.pool.Exec(b.ctx, `UPDATE keyed_effects SET created_at = $2 WHERE key = $1`, key.String(), created)
		require.NoError(t, err)
	}
	at(effects.MustKey("acme", "order", "start", "charge"), from)                         // first instant: in
	at(effects.MustKey("globex", "order", "mid", "charge"), from.Add(time.Hour))          // other tenant: in
	at(effects.MustKey("acme", "order", "last", "charge"), to.Add(-time.Microsecond))     // last instant: in
	at(effects.MustKey("acme", "order", "end", "charge"), to)                             // end is exclusive
	at(effects.MustKey("acme", "order", "before", "charge"), from.Add(-time.Microsecond)) // before the window
	at(effects.MustKey("acme", "order", "mid", "receipt"), from.Add(time.Hour))           // other kind
	at(effects.MustKey("acme", "order", "other", "charge"), from.Add(2*time.Hour).In(time.FixedZone("x", 3600)))

	recs, err := b.client.ListKind(b.ctx, "charge", from, to)
	require.NoError(t, err)
	var keys, tenants []string
	for _, r := range recs {
		require.Equal(t, "charge", r.Kind)
		require.Equal(t, effects.StateSucceeded, r.State)
		keys, tenants = append(keys, r.Key), append(tenants, r.TenantID)
	}
	require.Equal(t, []string{"acme:order:start:charge", "globex:order:mid:charge", "acme:order:other:charge", "acme:order:last:charge"}, keys)
	require.Equal(t, []string{"acme", "globex", "acme", "acme"}, tenants)
	require.JSONEq(t, `{"id":"pi_mid","amount":0}`, string(recs[1].Result), "the stored outcome comes back")

	none, err := b.client.ListKind(b.ctx, "refund", from, to)
	require.NoError(t, err)
	require.Empty(t, none)

	_, err = b.client.ListKind(b.ctx, "", from, to)
	require.ErrorContains(t, err, "kind is empty")
	_, err = b.client.ListKind(b.ctx, "charge", to, from)
	require.ErrorContains(t, err, "is not after its start")
	_, err = b.client.ListKind(b.ctx, "charge", from, from)
	require.ErrorContains(t, err, "is not after its start")
}

// ListKind finds a kind's records in each class they may be in: its own,
// and default, where they were claimed before the kind had a lifetime.
func TestListKindReadsEveryClassOfTheKind(t *testing.T) {
	t.Parallel()
	b := classesSetup(t)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, class, state, owner, result, finished_at)
VALUES ('acme:order:old:charge', 'acme', 'charge', 'default', 'succeeded', 'o', '{}', now())`)
	require.NoError(t, err)
	for _, c := range []struct{ key, kind string }{{"acme:order:new:charge", "charge"}, {"acme:order:new:label", "charge"}, {"acme:order:new:receipt", "receipt"}} {
		key, err := effects.ParseKey(c.key)
		require.NoError(t, err)
		_, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Kind: c.kind, Owner: "o"})
		require.NoError(t, err)
	}
	recs, err := b.client.ListKind(b.ctx, "charge", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	require.NoError(t, err)
	var keys []string
	for _, r := range recs {
		keys = append(keys, r.Key)
	}
	require.ElementsMatch(t, []string{"acme:order:old:charge", "acme:order:new:charge", "acme:order:new:label"}, keys)
}
