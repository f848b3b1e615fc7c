package effects_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

// A released claim leaves no record: the next claim is new whatever its
// fingerprint, and the releaser's stale handle cannot touch it.
func TestReleaseFreesTheKeyAndStaleHandlesStayOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "idempotency", "k1")
	stale, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "req-a", Fingerprint: "x"})
	require.NoError(t, err)
	ok, err := b.client.Release(b.ctx, key, "req-a", nil)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = b.client.Get(b.ctx, key)
	require.ErrorIs(t, err, effects.ErrNotFound)

	fresh, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "req-b", Fingerprint: "y"})
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, fresh.Mode)
	require.Equal(t, stale.Generation, fresh.Generation, "the generation starts again; the owner tells them apart")
	require.ErrorIs(t, b.client.Complete(b.ctx, stale, outcome{ID: "stale"}), effects.ErrLeaseLost)
	require.ErrorIs(t, b.client.Fail(b.ctx, stale, errors.New("stale")), effects.ErrLeaseLost)
	require.ErrorIs(t, b.client.Extend(b.ctx, stale, time.Minute), effects.ErrLeaseLost)
	ok, err = b.client.Release(b.ctx, key, "req-a", nil)
	require.NoError(t, err)
	require.False(t, ok, "another owner's claim")

	require.NoError(t, b.client.Complete(b.ctx, fresh, outcome{ID: "fresh"}))
	ok, err = b.client.Release(b.ctx, key, "req-b", nil)
	require.NoError(t, err)
	require.False(t, ok, "a finished record is never released")
	require.Equal(t, effects.StateSucceeded, b.record(t, key).State)

	_, err = b.client.Release(b.ctx, effects.Key{}, "o", nil)
	require.ErrorIs(t, err, effects.ErrInvalidKey)
	_, err = b.client.Release(b.ctx, key, "", nil)
	require.Error(t, err)
}

// ReleaseClaim frees a claim in its own leaf, also one whose Complete ran in
// a transaction that rolled back, and never a finished record, another
// owner's claim or a claim that was not acquired.
func TestReleaseClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "idempotency", "k2")
	claim := func(owner string) *effects.Claim {
		cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: owner, Kind: "api_request"})
		require.NoError(t, err)
		return cl
	}
	released := func(cl *effects.Claim) bool {
		ok, err := b.client.ReleaseClaim(b.ctx, cl)
		require.NoError(t, err)
		return ok
	}

	rolledBack := claim("req-a")
	require.EqualError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		require.NoError(t, b.client.CompleteTx(b.ctx, tx, rolledBack, outcome{ID: "rolled back"}))
		return errors.New("roll back")
	}), "roll back")
	require.True(t, released(rolledBack), "the completion rolled back: the record is still claimed")
	_, err := b.client.Get(b.ctx, key)
	require.ErrorIs(t, err, effects.ErrNotFound)

	fresh := claim("req-b")
	require.False(t, released(rolledBack), "another owner's claim")
	require.NoError(t, b.client.Complete(b.ctx, fresh, outcome{ID: "fresh"}))
	require.False(t, released(fresh), "a finished record is never released")
	require.Equal(t, effects.StateSucceeded, b.record(t, key).State)

	done := claim("req-c")
	require.True(t, done.Done)
	_, err = b.client.ReleaseClaim(b.ctx, done)
	require.Error(t, err, "a claim that found the effect done was not acquired")
	_, err = b.client.ReleaseClaim(b.ctx, nil)
	require.Error(t, err)
}

// ClaimParams.MaxResultBytes raises the outcome cap for one claim only.
func TestMaxResultBytesPerClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	big := map[string]string{"body": strings.Repeat("x", 10<<10)}
	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey("acme", "req", "1"), Owner: "o", MaxResultBytes: 16 << 10})
	require.NoError(t, err)
	require.NoError(t, b.client.Complete(b.ctx, cl, big))

	cl, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey("acme", "req", "2"), Owner: "o", MaxResultBytes: 8 << 10})
	require.NoError(t, err)
	require.ErrorIs(t, b.client.Complete(b.ctx, cl, big), effects.ErrResultTooLarge)

	cl, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey("acme", "req", "3"), Owner: "o"})
	require.NoError(t, err)
	require.ErrorIs(t, b.client.Complete(b.ctx, cl, big), effects.ErrResultTooLarge, "the default cap")

	_, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey("acme", "req", "4"), Owner: "o", MaxResultBytes: -1})
	require.Error(t, err)
}

// AsyncCommit changes the commit of the claim's own statement only, and
// ClaimTx refuses it.
func TestAsyncCommitClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, fxc := connClient(t, b)
	key := effects.MustKey("acme", "req", "async")
	cl, err := fxc.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o", AsyncCommit: true})
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, cl.Mode)
	var setting string
	require.NoError(t, conn.QueryRow(b.ctx, `SHOW synchronous_commit`).Scan(&setting))
	require.Equal(t, "on", setting, "the setting ended with the claim's transaction")
	again, err := fxc.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o2", AsyncCommit: true})
	require.ErrorIs(t, err, effects.ErrInProgress)
	require.Nil(t, again)

	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.client.ClaimTx(b.ctx, tx, effects.ClaimParams{Key: effects.MustKey("acme", "req", "tx"), Owner: "o", AsyncCommit: true})
		return err
	})
	require.ErrorContains(t, err, "AsyncCommit")
}

// connClient returns one of b's connections, released when t ends, and a
// Client on it alone, so that a test can read the session's settings after
// a claim.
func connClient(t *testing.T, b *bundle) (*pgxpool.Conn, *effects.Client) {
	t.Helper()
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	c, err := effects.NewClient(conn, nil)
	require.NoError(t, err)
	return conn, c
}

// PruneKind deletes one kind's old finished records and, when asked, its
// long-expired claims; nothing of other kinds, nothing young, no live claim.
func TestPruneKind(t *testing.T) {
	t.Parallel()
	b := legacySetup(t)
	insert := func(key, kind, state, ago string) {
		_, err := b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, lease_until, created_at, finished_at)
			VALUES ($1, 'acme', $2, $3, 'o',
				CASE WHEN $3 = 'claimed' THEN now() - $4::interval + interval '30 seconds' END,
				now() - $4::interval, CASE WHEN $3 <> 'claimed' THEN now() - $4::interval END)`, "acme:"+key, kind, state, ago)
		require.NoError(t, err)
	}
	insert("req:old", "req", "succeeded", "25 hours")
	insert("req:young", "req", "succeeded", "23 hours")
	insert("req:abandoned", "req", "claimed", "2 days")
	insert("req:live", "req", "claimed", "0 seconds")
	insert("order:1:charge", "charge", "succeeded", "2 days")
	insert("order:2:charge", "charge", "claimed", "2 days")

	_, err := b.client.PruneKind(b.ctx, "", nil)
	require.Error(t, err)
	_, err = b.client.PruneKind(b.ctx, "req", &effects.PruneKindOpts{Retention: time.Minute})
	require.ErrorContains(t, err, "under one hour")

	n, err := b.client.PruneKind(b.ctx, "req", &effects.PruneKindOpts{Retention: 24 * time.Hour})
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the old finished record only")
	n, err = b.client.PruneKind(b.ctx, "req", &effects.PruneKindOpts{Retention: 24 * time.Hour, ExpiredClaims: true, BatchSize: 1})
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the abandoned claim")

	rows, err := b.pool.Query(b.ctx, `SELECT key FROM keyed_effects ORDER BY key`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"acme:order:1:charge", "acme:order:2:charge", "acme:req:live", "acme:req:young"}, left)
}

// Release finds a claim where its kind put it: given the kind, only there;
// without one, in the classes of the key's last part and then in every
// other. A kind that names other leaves releases nothing.
func TestReleaseLooksWhereTheKindPutTheRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	day := 24 * time.Hour
	require.NoError(t, b.client.SetLifetimes(b.ctx, []effects.Lifetime{
		{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}, {Kind: "api_request", Keep: day}}, nil))
	key := effects.MustKey("acme", "idempotency", "k3")
	claimed := func() {
		_, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Kind: "api_request", Owner: "req-a"})
		require.NoError(t, err)
	}
	for _, opts := range []*effects.ReleaseOpts{{Kind: "api_request"}, nil} {
		claimed()
		ok, err := b.client.Release(b.ctx, key, "req-a", opts)
		require.NoError(t, err)
		require.True(t, ok, "%+v", opts)
		_, err = b.client.Get(b.ctx, key)
		require.ErrorIs(t, err, effects.ErrNotFound)
	}
	claimed()
	ok, err := b.client.Release(b.ctx, key, "req-a", &effects.ReleaseOpts{Kind: "charge"})
	require.NoError(t, err)
	require.False(t, ok, "a charge's leaves do not hold it")
	require.Equal(t, effects.StateClaimed, b.record(t, key).State)
}
