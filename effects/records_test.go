package effects_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

// SucceededSQL holds for a succeeded record of its kind, wherever the
// record is: its kind's class, default (a kind without a lifetime of its
// own, or a kind named apart from its key) or an unpartitioned table; and
// on the partitioned table it names no other class's leaf.
func TestSucceededSQL(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	partitioned := setup(t)
	require.NoError(t, partitioned.client.SetLifetimes(partitioned.ctx,
		[]effects.Lifetime{{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}, {Kind: "api-request", Keep: day}}, nil))
	plainPool := effectstest.NewPool(t, &effectstest.PoolOpts{Unpartitioned: true})
	plain := &bundle{ctx: context.Background(), pool: plainPool, client: effectstest.NewClient(t, plainPool, nil)}

	for name, b := range map[string]*bundle{"partitioned": partitioned, "unpartitioned": plain} {
		for _, c := range []struct{ key, kind string }{
			{"acme:order:1:charge", "charge"},     // its own class
			{"acme:order:1:receipt", "receipt"},   // no lifetime: default
			{"acme:order:1:label", "api-request"}, // a kind apart from its key
			{"acme:order:2:charge", "charge"},     // claimed, not finished
			{"acme:order:3:charge", "charge"},     // no record
		} {
			key, err := effects.ParseKey(c.key)
			require.NoError(t, err)
			if !strings.HasPrefix(c.key, "acme:order:3:") {
				cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Kind: c.kind, Owner: "o"})
				require.NoError(t, err)
				if !strings.HasPrefix(c.key, "acme:order:2:") {
					require.NoError(t, b.client.Complete(b.ctx, cl, "ok"))
				}
			}
			var ok bool
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT `+effects.SucceededSQL(1, c.kind), c.key).Scan(&ok))
			require.Equal(t, strings.HasPrefix(c.key, "acme:order:1:"), ok, "%s: %s", name, c.key)
		}
	}

	rows, err := partitioned.pool.Query(partitioned.ctx, `EXPLAIN (COSTS OFF) SELECT `+strings.ReplaceAll(effects.SucceededSQL(1, "charge"), "$1", "'k'"))
	require.NoError(t, err)
	var lines []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		lines = append(lines, line)
	}
	require.NoError(t, rows.Err())
	text := strings.Join(lines, "\n")
	require.Contains(t, text, "keyed_effects_charge_")
	require.NotContains(t, text, "keyed_effects_api_request_", "the guard of a charge plans no other class's leaf")
}
