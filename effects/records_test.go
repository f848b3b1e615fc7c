package effects_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

// SucceededSQL holds for a succeeded record of its kind, wherever the
// record is: its kind's class, default (a kind without a lifetime of its
// own, or a kind named apart from its key) or an unpartitioned table; and
// on the partitioned table it names no other class's leaf.
func TestSucceededSQL(t *testing.T) {
	t.Parallel()
	partitioned := classesSetup(t)

	for name, b := range map[string]*bundle{"partitioned": partitioned, "unpartitioned": legacySetup(t)} {
		for _, c := range []struct {
			key, kind        string
			claimed, succeed bool
		}{
			{"acme:order:1:charge", "charge", true, true},     // its own class
			{"acme:order:1:receipt", "receipt", true, true},   // no lifetime: default
			{"acme:order:1:label", "api-request", true, true}, // a kind apart from its key
			{"acme:order:2:charge", "charge", true, false},    // claimed, not finished
			{"acme:order:3:charge", "charge", false, false},   // no record
		} {
			if c.claimed {
				key, err := effects.ParseKey(c.key)
				require.NoError(t, err)
				cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Kind: c.kind, Owner: "o"})
				require.NoError(t, err)
				if c.succeed {
					require.NoError(t, b.client.Complete(b.ctx, cl, "ok"))
				}
			}
			var ok bool
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT `+effects.SucceededSQL(1, c.kind), c.key).Scan(&ok))
			require.Equal(t, c.succeed, ok, "%s: %s", name, c.key)
		}
	}

	rows, err := partitioned.pool.Query(partitioned.ctx, `EXPLAIN (COSTS OFF) SELECT `+strings.ReplaceAll(effects.SucceededSQL(1, "charge"), "$1", "'k'"))
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "keyed_effects_charge_")
	require.NotContains(t, plan, "keyed_effects_api_request_", "the guard of a charge plans no other class's leaf")
}

// Get finds a record wherever it is: its key's kind's class, default, a
// class of a kind named apart from its key, or an unpartitioned table. A
// record found in its key's kind's classes locks no other class's leaf.
func TestGet(t *testing.T) {
	t.Parallel()
	partitioned := classesSetup(t)

	for name, b := range map[string]*bundle{"partitioned": partitioned, "unpartitioned": legacySetup(t)} {
		for _, c := range []struct{ key, kind string }{
			{"acme:order:1:charge", "charge"},      // its own class
			{"acme:order:1:receipt", "receipt"},    // no lifetime: default
			{"acme:order:1:label", "api-request"},  // a kind apart from its key
			{"acme:order:2:charge", "api-request"}, // apart, and the key names another class
		} {
			key, err := effects.ParseKey(c.key)
			require.NoError(t, err)
			_, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Kind: c.kind, Owner: "o"})
			require.NoError(t, err)
			rec, err := b.client.Get(b.ctx, key)
			require.NoError(t, err, "%s: %s", name, c.key)
			require.Equal(t, c.kind, rec.Kind, "%s: %s", name, c.key)
		}
		_, err := b.client.Get(b.ctx, effects.MustKey("acme", "order", "3", "charge"))
		require.ErrorIs(t, err, effects.ErrNotFound, name)
		_, err = b.client.Get(b.ctx, effects.Key{})
		require.ErrorIs(t, err, effects.ErrInvalidKey, name)
	}

	b := partitioned
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Rollback(b.ctx)) }()
	_, err = b.client.GetTx(b.ctx, tx, effects.MustKey("acme", "order", "1", "charge"))
	require.NoError(t, err)
	var other int
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
		WHERE l.pid = pg_backend_pid() AND c.relname LIKE 'keyed\_effects\_api\_request%'`).Scan(&other))
	require.Zero(t, other, "a charge found in its classes locks no api_request leaf")
}

// List takes exactly the keys that extend its prefix, on both layouts:
// not the prefix itself, nor keys whose next byte sorts just below or
// above the separator. A session keeps a generic plan of its statement
// instead of planning it on every call.
func TestListTakesTheKeysUnderItsPrefix(t *testing.T) {
	t.Parallel()
	partitioned := classesSetup(t)
	want := []string{"acme:order:1:charge", "acme:order:1:refund:r1:refund_stripe", "acme:order:1:receipt"}
	others := []string{"acme:order:1", "acme:order:10:charge", "acme:order:1-2:charge", "acme:order:1;2:charge", "acme:order:1a:charge", "globex:order:1:charge"}
	for name, b := range map[string]*bundle{"partitioned": partitioned, "unpartitioned": legacySetup(t)} {
		for _, k := range append(slices.Clone(want), others...) {
			key, err := effects.ParseKey(k)
			require.NoError(t, err)
			_, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o"})
			require.NoError(t, err)
		}
		recs, err := b.client.List(b.ctx, effects.MustKey("acme", "order", "1"))
		require.NoError(t, err)
		var got []string
		for _, r := range recs {
			got = append(got, r.Key)
		}
		require.ElementsMatch(t, want, got, name)
	}

	// A session plans the statement five times, then keeps a generic plan,
	// also where the statistics know the tenant (as a table with other
	// tenants' records has them), which a plan made for the tenant uses.
	b := partitioned
	_, err := b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, class, state, owner, result, finished_at)
SELECT 'initech:order:' || i || ':charge', 'initech', 'charge', 'charge', 'succeeded', 'o', '{}', now()
FROM generate_series(1, 20000) i;
ANALYZE keyed_effects`)
	require.NoError(t, err)
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for range 20 {
			if _, err := b.client.ListTx(b.ctx, tx, effects.MustKey("acme", "order", "1")); err != nil {
				return err
			}
		}
		var generic, custom int
		require.NoError(t, tx.QueryRow(b.ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1`,
			effects.ListSQL).Scan(&generic, &custom))
		require.GreaterOrEqual(t, generic, 15, "List's generic plans of 20")
		require.Equal(t, 5, custom, "List's custom plans of 20")
		return nil
	})
	require.NoError(t, err)
}

// classesSetup is setup with the charge and api-request kinds in classes of
// their own and every other kind in default.
func classesSetup(t *testing.T) *bundle {
	t.Helper()
	b := setup(t)
	day := 24 * time.Hour
	require.NoError(t, b.client.SetLifetimes(b.ctx,
		[]effects.Lifetime{{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}, {Kind: "api-request", Keep: day}}, nil))
	return b
}
