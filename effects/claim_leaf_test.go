package effects_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

// told is a claim of key told it was born a second ago.
func told(key effects.Key, owner string) effects.ClaimParams {
	return effects.ClaimParams{Key: key, Owner: owner, NotBefore: time.Now().Add(-time.Second)}
}

// A told claim inside one leaf goes from Go: it inserts into the leaf and
// completes there; a repeat, an untold claim and a claim of a kind with no
// leaf in the picture go through the claim function.
func TestToldClaimGoesFromGoIntoItsLeaf(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	key := effects.MustKey("acme", "doc", "go", "archive")
	cl, err := effects.ClaimFromGoForTest(b.ctx, b.client, b.pool, told(key, "first"))
	require.NoError(t, err)
	require.NotNil(t, cl)
	require.Equal(t, effects.ModeNew, cl.Mode)
	require.Equal(t, 1, cl.Attempt)
	require.WithinDuration(t, time.Now().Add(effects.DefaultLease), cl.LeaseUntil, time.Minute)
	leaves, ok := effects.LeafPictureForTest(b.client, "archive")
	require.True(t, ok)
	require.Equal(t, []string{"keyed_effects_archive_wide"}, leaves)
	require.Equal(t, "keyed_effects_archive_wide", leafOf(t, b, key))
	require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "doc_1", Amount: 1}))

	again, err := effects.ClaimFromGoForTest(b.ctx, b.client, b.pool, told(key, "second"))
	require.NoError(t, err)
	require.Nil(t, again, "a conflict goes through the claim function")
	replay, err := b.client.Claim(b.ctx, told(key, "second"))
	require.NoError(t, err)
	require.True(t, replay.Done)
	require.JSONEq(t, `{"id":"doc_1","amount":1}`, string(replay.Result))

	untold := effects.ClaimParams{Key: effects.MustKey("acme", "doc", "untold", "archive"), Owner: "o"}
	cl, err = effects.ClaimFromGoForTest(b.ctx, b.client, b.pool, untold)
	require.NoError(t, err)
	require.Nil(t, cl)
}

// A stale picture never decides: a leaf that is gone, or one the claim
// function would not insert into first for the kind (another class's),
// leaves the claim to the function, which finds the key where it is.
func TestClaimFromAStalePictureGoesThroughTheFunction(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	day := time.Now().UTC().Truncate(24 * time.Hour)
	other := currentLeafOf(t, b, "default")
	for i, leaf := range []string{"keyed_effects_archive_gone", other} {
		key := effects.MustKey("acme", "doc", fmt.Sprint("stale-", i), "archive")
		effects.SetLeafPictureForTest(b.client, "archive", "default", leaf, day.Add(-30*24*time.Hour), day.Add(30*24*time.Hour))
		cl, err := effects.ClaimFromGoForTest(b.ctx, b.client, b.pool, told(key, "o"))
		require.NoError(t, err, leaf)
		require.Nil(t, cl, leaf)
		require.Zero(t, countKey(t, b, key), "%s: the guard refused, nothing was inserted", leaf)
		_, kept := effects.LeafPictureForTest(b.client, "archive")
		require.Equal(t, leaf == other, kept, "%s: only a gone leaf drops the picture", leaf)

		effects.SetLeafPictureForTest(b.client, "archive", "default", leaf, day.Add(-30*24*time.Hour), day.Add(30*24*time.Hour))
		cl, err = b.client.Claim(b.ctx, told(key, "o"))
		require.NoError(t, err, leaf)
		require.Equal(t, effects.ModeNew, cl.Mode)
		require.Equal(t, "keyed_effects_archive_wide", leafOf(t, b, key), leaf)
	}
}

// A picture's leaves for the kinds it does not list ("") are judged by the
// claim's kind, not as "": a kind the lifetimes have since given a class of
// its own is refused the old class's leaf.
func TestClaimOfAKindNewlyListedIsRefusedTheDefaultLeaf(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	day := time.Now().UTC().Truncate(24 * time.Hour)
	leaf := currentLeafOf(t, b, "default")
	effects.SetLeafPictureForTest(b.client, "", "default", leaf, day.Add(-30*24*time.Hour), day.Add(30*24*time.Hour))
	key := effects.MustKey("acme", "doc", "newly-listed", "archive")
	cl, err := effects.ClaimFromGoForTest(b.ctx, b.client, b.pool, told(key, "o"))
	require.NoError(t, err)
	require.Nil(t, cl)
	require.Zero(t, countKey(t, b, key), "the guard refused, nothing was inserted")
}

// A told AsyncCommit claim goes from Go too, and the setting ends with its
// statement's transaction.
func TestToldAsyncCommitClaimGoesFromGo(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	conn, fxc := connClient(t, b)
	key := effects.MustKey("acme", "doc", "async", "archive")
	p := told(key, "o")
	p.AsyncCommit = true
	cl, err := effects.ClaimFromGoForTest(b.ctx, fxc, conn, p)
	require.NoError(t, err)
	require.NotNil(t, cl)
	require.Equal(t, "keyed_effects_archive_wide", leafOf(t, b, key))
	var setting string
	require.NoError(t, conn.QueryRow(b.ctx, `SHOW synchronous_commit`).Scan(&setting))
	require.Equal(t, "on", setting, "the setting ended with the claim's transaction")
}

// Inside a caller's transaction a gone leaf has aborted the transaction:
// ClaimTx says so as a transient error, and the next transaction claims.
func TestClaimTxFromAGoneLeafIsTransient(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	key := effects.MustKey("acme", "doc", "tx", "archive")
	day := time.Now().UTC().Truncate(24 * time.Hour)
	effects.SetLeafPictureForTest(b.client, "archive", "archive", "keyed_effects_archive_gone", day.Add(-24*time.Hour), day.Add(48*time.Hour))
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = b.client.ClaimTx(b.ctx, tx, told(key, "o"))
	require.Error(t, err)
	require.True(t, effects.IsTransient(err), "%v", err)
	require.NoError(t, tx.Rollback(b.ctx))

	tx, err = b.pool.Begin(b.ctx)
	require.NoError(t, err)
	cl, err := b.client.ClaimTx(b.ctx, tx, told(key, "o"))
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, cl.Mode)
	require.NoError(t, b.client.CompleteTx(b.ctx, tx, cl, outcome{ID: "doc_tx", Amount: 2}))
	require.NoError(t, tx.Commit(b.ctx))
	require.Equal(t, "keyed_effects_archive_wide", leafOf(t, b, key))
}

// Told claims from Go and untold ones through the function race for the
// same keys: the key's lock orders them, and one wins each key.
func TestToldAndUntoldClaimsRaceForOneKey(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	const racers = 16
	for round := range 10 {
		key := effects.MustKey("acme", "doc", fmt.Sprint("mixed-", round), "archive")
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins, errs := 0, []error{}
		start := make(chan struct{})
		for i := range racers {
			wg.Go(func() {
				<-start
				p := effects.ClaimParams{Key: key, Owner: fmt.Sprint("racer-", i)}
				if i%2 == 0 {
					p = told(key, p.Owner)
				}
				cl, err := b.client.Claim(b.ctx, p)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, effects.ErrInProgress):
				case err != nil:
					errs = append(errs, err)
				case !cl.Done:
					wins++
				}
			})
		}
		close(start)
		wg.Wait()
		require.Empty(t, errs)
		require.Equal(t, 1, wins, "round %d", round)
		require.Equal(t, 1, countKey(t, b, key))
	}
}

// The guard and the picture are written from the same leaves as the claim
// function: a kind whose look-up still reads the default class (its
// lifetime set less than an hour ago) has no leaf, and the guard refuses
// it every leaf.
func TestAKindNotYetApartHasNoLeafToGoFromGo(t *testing.T) {
	t.Parallel()
	b := raceSetup(t)
	require.NoError(t, b.client.SetLifetimes(b.ctx, []effects.Lifetime{
		{Kind: "", Keep: effects.DefaultRetention}, {Kind: "fresh", Keep: 90 * 24 * time.Hour}}, nil))
	var leaves int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(leaf) FROM keyed_effects_claim_leaves() WHERE kind = 'fresh'`).Scan(&leaves))
	require.Zero(t, leaves)
	var any bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(bool_or(keyed_effects_claim_leaf('fresh', c.class, c.leaf, now() - interval '1 second')), false)
		FROM keyed_effects_claim_leaves() c WHERE c.leaf IS NOT NULL`).Scan(&any))
	require.False(t, any)
	key := effects.MustKey("acme", "doc", "fresh", "fresh")
	cl, err := effects.ClaimFromGoForTest(b.ctx, b.client, b.pool, told(key, "o"))
	require.NoError(t, err)
	require.Nil(t, cl)
}

// On a schema before effects migration 7 a told claim finds no picture of
// the leaves and claims through the function.
func TestToldClaimBeforeMigrationSevenGoesThroughTheFunction(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	_, err := b.pool.Exec(b.ctx, `DROP FUNCTION keyed_effects_claim_leaves(); DROP FUNCTION keyed_effects_claim_leaf(text, text, text, timestamptz)`)
	require.NoError(t, err)
	key := effects.MustKey("acme", "doc", "before7", "archive")
	cl, err := effects.ClaimFromGoForTest(b.ctx, b.client, b.pool, told(key, "o"))
	require.NoError(t, err)
	require.Nil(t, cl)
	leaves, ok := effects.LeafPictureForTest(b.client, "archive")
	require.False(t, ok)
	require.Empty(t, leaves)
	cl, err = b.client.Claim(b.ctx, told(key, "o"))
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, cl.Mode)
	require.Equal(t, "keyed_effects_archive_wide", leafOf(t, b, key))
}

// A Repeat claim never goes from Go: it claims through the function, which
// replays a done key and still claims a fresh one, in its leaf.
func TestRepeatClaimGoesThroughTheFunction(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	done, fresh := effects.MustKey("acme", "doc", "repeat-done", "archive"), effects.MustKey("acme", "doc", "repeat-fresh", "archive")
	cl, err := b.client.Claim(b.ctx, told(done, "first"))
	require.NoError(t, err)
	require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "doc_r", Amount: 3}))

	again := func(key effects.Key) effects.ClaimParams {
		p := told(key, "again")
		p.Repeat = true
		return p
	}
	for _, key := range []effects.Key{done, fresh} {
		cl, err := effects.ClaimFromGoForTest(b.ctx, b.client, b.pool, again(key))
		require.NoError(t, err)
		require.Nil(t, cl, "%s: a Repeat claim goes through the function", key)
	}
	replay, err := b.client.Claim(b.ctx, again(done))
	require.NoError(t, err)
	require.True(t, replay.Done)
	require.JSONEq(t, `{"id":"doc_r","amount":3}`, string(replay.Result))

	cl, err = b.client.Claim(b.ctx, again(fresh))
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, cl.Mode)
	require.Equal(t, "keyed_effects_archive_wide", leafOf(t, b, fresh))
}

// currentLeafOf names the leaf of class that holds records created now.
func currentLeafOf(t *testing.T, b *bundle, class string) string {
	t.Helper()
	leaves, err := b.client.Leaves(b.ctx)
	require.NoError(t, err)
	for _, l := range leaves {
		if l.Class == class && !l.From.After(time.Now()) && l.To.After(time.Now()) {
			return l.Name
		}
	}
	require.FailNow(t, "no current leaf", "class %s", class)
	return ""
}
