package effects_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

// race claims key from n goroutines with distinct owners at once and
// returns how many acquired it, failing on any error but InProgress.
func race(t *testing.T, b *bundle, key effects.Key, n int) int {
	t.Helper()
	return raceWith(t, b, effects.ClaimParams{Key: key}, n)
}

// raceWith is race with p's Key and its other params but Owner.
func raceWith(t *testing.T, b *bundle, p effects.ClaimParams, n int) int {
	t.Helper()
	var wg sync.WaitGroup
	wins := make(chan struct{}, n)
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			p := p
			p.Owner = fmt.Sprintf("racer-%d", i)
			cl, err := b.client.Claim(b.ctx, p)
			switch {
			case errors.Is(err, effects.ErrInProgress):
			case err != nil:
				errs <- err
			case !cl.Done:
				wins <- struct{}{}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return len(wins)
}

func countKey(t *testing.T, b *bundle, key effects.Key) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM keyed_effects WHERE key = $1`, key.String()).Scan(&n))
	return n
}

// raceSetup is setup with a pool of 20: racers queue on the pool and on
// the key, and the package's parallel tests stay under max_connections.
func raceSetup(t *testing.T) *bundle {
	t.Helper()
	pool := effectstest.NewPool(t, &effectstest.PoolOpts{MaxConns: 20})
	return &bundle{ctx: context.Background(), pool: pool, client: effectstest.NewClient(t, pool, nil)}
}

func TestPartitionedClaimSixtyFourRacersOneWinner(t *testing.T) {
	t.Parallel()
	b := raceSetup(t)
	for i := range 5 {
		key := effects.MustKey("acme", "order", fmt.Sprint("r", i), "charge")
		require.Equal(t, 1, race(t, b, key, 64))
		require.Equal(t, 1, countKey(t, b, key))
	}
}

// A claim still in flight in yesterday's leaf (begun just before midnight
// UTC, not yet committed) and 64 racers today, told or not told when the
// key was born: they wait on its key, then find its record; no second
// record is written in today's leaf.
func TestPartitionedClaimAcrossALeafBoundary(t *testing.T) {
	t.Parallel()
	b := raceSetup(t)
	_, err := b.client.EnsureLeaves(b.ctx, 48*time.Hour, 0)
	require.NoError(t, err)
	midnight := time.Now().UTC().Truncate(24 * time.Hour)
	born := midnight.Add(-time.Millisecond)
	for _, told := range []bool{false, true} {
		key := effects.MustKey("acme", "order", fmt.Sprint("midnight-", told), "charge")
		p := effects.ClaimParams{Key: key}
		if told {
			p.NotBefore = born
		}
		tx, err := b.pool.Begin(b.ctx)
		require.NoError(t, err)
		// What keyed_effects_claim does, with created_at a millisecond before midnight.
		_, err = tx.Exec(b.ctx, `SELECT pg_advisory_xact_lock(1801, hashtext($1))`, key.String())
		require.NoError(t, err)
		_, err = tx.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, class, state, owner, lease_until, created_at)
		VALUES ($1, 'acme', 'charge', 'default', 'claimed', 'before-midnight', now() + interval '1 hour', $2)`,
			key.String(), born)
		require.NoError(t, err)

		wins := make(chan int, 1)
		go func() { wins <- raceWith(t, b, p, 64) }()
		time.Sleep(200 * time.Millisecond) // let the racers queue on the key
		require.NoError(t, tx.Commit(b.ctx))
		require.Equal(t, 0, <-wins, "the claim from before midnight holds the key (NotBefore told: %t)", told)
		require.Equal(t, 1, countKey(t, b, key))
		rec, err := b.client.Get(b.ctx, key)
		require.NoError(t, err)
		require.Equal(t, "before-midnight", rec.Owner)
		require.True(t, rec.CreatedAt.Before(midnight))
	}
}

// A key finished ten days ago, in a leaf still retained, is a duplicate:
// the claim replays its outcome.
func TestPartitionedClaimFindsKeyInOldLeaf(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := finishedTenDaysAgo(t, b, "old", "pi_old")

	again, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "other"})
	require.NoError(t, err)
	require.True(t, again.Done)
	require.JSONEq(t, `{"id":"pi_old","amount":700}`, string(again.Result))
	require.Equal(t, 1, countKey(t, b, key))
}

// finishedTenDaysAgo claims and completes a key named id with outcome
// {ID: pi, Amount: 700}, and moves its record into a leaf of ten days ago,
// still retained.
func finishedTenDaysAgo(t *testing.T, b *bundle, id, pi string) effects.Key {
	t.Helper()
	_, err := b.client.EnsureLeaves(b.ctx, 11*24*time.Hour, 0)
	require.NoError(t, err)
	key := effects.MustKey("acme", "order", id, "charge")
	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o"})
	require.NoError(t, err)
	require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: pi, Amount: 700}))
	backdate(t, b, key, 10*24*time.Hour)
	return key
}

// backdate moves key's record into the leaf of ago.
func backdate(t *testing.T, b *bundle, key effects.Key, ago time.Duration) {
	t.Helper()
	tag, err := b.pool.Exec(b.ctx, `UPDATE keyed_effects SET created_at = now() - $2::interval,
		finished_at = CASE WHEN finished_at IS NOT NULL THEN now() - $2::interval END WHERE key = $1`, key.String(), ago)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

// retireSetup is setup with a lifetime of two days for every kind and
// daily leaves from ten days back.
func retireSetup(t *testing.T) *bundle {
	t.Helper()
	b := setup(t)
	require.NoError(t, b.client.SetLifetimes(b.ctx, []effects.Lifetime{{Kind: "", Keep: 2 * 24 * time.Hour}}, nil))
	_, err := b.client.EnsureLeaves(b.ctx, 10*24*time.Hour, 0)
	require.NoError(t, err)
	return b
}

// leafOf names the leaf that holds key's record.
func leafOf(t *testing.T, b *bundle, key effects.Key) string {
	t.Helper()
	var leaf string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT tableoid::regclass::text FROM keyed_effects WHERE key = $1`, key.String()).Scan(&leaf))
	return leaf
}

// Retire drops an expired leaf of finished records, keeps and reports one
// that holds a claim in flight, and keeps young leaves and their records.
func TestRetireDropsExpiredLeavesButNeverAClaimInFlight(t *testing.T) {
	t.Parallel()
	b := retireSetup(t)
	done := effects.MustKey("acme", "order", "done", "charge")
	flying := effects.MustKey("acme", "order", "flying", "charge")
	young := effects.MustKey("acme", "order", "young", "charge")
	for _, k := range []effects.Key{done, young} {
		cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: k, Owner: "o"})
		require.NoError(t, err)
		require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "pi_" + k.Parts()[2]}))
	}
	_, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: flying, Owner: "o"})
	require.NoError(t, err)
	backdate(t, b, done, 8*24*time.Hour)
	backdate(t, b, flying, 6*24*time.Hour)

	res, err := b.client.Retire(b.ctx, nil)
	require.NoError(t, err)
	require.Len(t, res.Blocked, 1)
	for leaf, n := range res.Blocked {
		require.EqualValues(t, 1, n, leaf)
	}
	require.NotEmpty(t, res.Dropped)
	_, err = b.client.Get(b.ctx, done)
	require.ErrorIs(t, err, effects.ErrNotFound, "the expired leaf went")
	rec, err := b.client.Get(b.ctx, flying)
	require.NoError(t, err, "the claim in flight stays")
	require.Equal(t, effects.StateClaimed, rec.State)
	_, err = b.client.Get(b.ctx, young)
	require.NoError(t, err)

	leaves, err := b.client.Leaves(b.ctx)
	require.NoError(t, err)
	now := time.Now()
	for _, l := range leaves {
		if l.Expired(now) {
			require.Contains(t, res.Blocked, l.Name, "only a blocked leaf outlives its lifetime")
		}
	}
	require.True(t, leaves[len(leaves)-1].To.After(now.Add(47*time.Hour)), "leaves are made two days ahead")
}

// A record of an expired leaf that becomes a claim while Retire works on
// the leaf (a takeover, named by leaf, that commits while Retire waits for
// its lock) is found by the check the drop runs under that lock: the leaf
// is attached back and reported, and the claim stays.
func TestRetireKeepsALeafWhoseRecordIsTakenOverMeanwhile(t *testing.T) {
	t.Parallel()
	b := retireSetup(t)
	late := effects.MustKey("acme", "order", "late", "charge")
	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: late, Owner: "o"})
	require.NoError(t, err)
	require.NoError(t, b.client.Fail(b.ctx, cl, effects.Transient(errors.New("503"))))
	backdate(t, b, late, 8*24*time.Hour)
	leaf := leafOf(t, b, late)

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var takerPID int
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&takerPID))
	_, err = tx.Exec(b.ctx, `UPDATE `+pgx.Identifier{leaf}.Sanitize()+` SET state = 'claimed', owner = 'taker',
		lease_until = now() + interval '1 hour', generation = generation + 1 WHERE key = $1`, late.String())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	done := make(chan *effects.RetireResult, 1)
	go func() {
		res, err := b.client.Retire(ctx, nil)
		assert.NoError(t, err)
		done <- res
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE $1 = ANY (pg_blocking_pids(pid)))`, takerPID).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 10*time.Millisecond, "Retire waits for the takeover")
	require.NoError(t, tx.Commit(b.ctx))

	res := <-done
	require.Equal(t, map[string]int64{leaf: 1}, res.Blocked)
	rec, err := b.client.Get(b.ctx, late)
	require.NoError(t, err, "the leaf is attached back")
	require.Equal(t, effects.StateClaimed, rec.State)
	require.Equal(t, "taker", rec.Owner)
}

// A Retire killed between detaching a leaf and dropping it leaves the leaf
// detached, or its detach pending; the next Retire drops such a leaf, or
// attaches it back when it holds a claim in flight.
func TestRetireFinishesWhatAKilledRetireLeft(t *testing.T) {
	t.Parallel()
	b := retireSetup(t)
	leaves := map[string]string{}
	keys := map[string]effects.Key{}
	for name, ago := range map[string]time.Duration{"detached": 8, "flying": 6, "pending": 4} {
		keys[name] = effects.MustKey("acme", "order", name, "charge")
		cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: keys[name], Owner: "o"})
		require.NoError(t, err)
		if name != "flying" {
			require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "pi_" + name}))
		}
		backdate(t, b, keys[name], ago*24*time.Hour)
		leaves[name] = leafOf(t, b, keys[name])
	}
	for _, name := range []string{"detached", "flying"} {
		_, err := b.pool.Exec(b.ctx, `ALTER TABLE keyed_effects_default DETACH PARTITION `+pgx.Identifier{leaves[name]}.Sanitize())
		require.NoError(t, err)
	}
	leavePending(t, b, leaves["pending"])

	res, err := b.client.Retire(b.ctx, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{leaves["flying"]: 1}, res.Blocked)
	require.Subset(t, res.Dropped, []string{leaves["detached"], leaves["pending"]})
	for _, name := range []string{"detached", "pending"} {
		var exists bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT to_regclass($1) IS NOT NULL`, leaves[name]).Scan(&exists))
		require.False(t, exists, name)
	}
	rec, err := b.client.Get(b.ctx, keys["flying"])
	require.NoError(t, err, "the leaf with a claim in flight is attached back")
	require.Equal(t, effects.StateClaimed, rec.State)
}

// leavePending starts DETACH PARTITION CONCURRENTLY of leaf and cancels it
// once its first transaction has marked the detach pending and it waits for a
// reader of the class partition, as a killed Retire would: the detach stays
// pending.
func leavePending(t *testing.T, b *bundle, leaf string) {
	t.Helper()
	reader, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, reader.Rollback(b.ctx)) }()
	_, err = reader.Exec(b.ctx, `SELECT FROM keyed_effects_default LIMIT 0`)
	require.NoError(t, err)
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid uint32
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	detached := make(chan error, 1)
	go func() {
		_, err := conn.Exec(b.ctx, `ALTER TABLE keyed_effects_default DETACH PARTITION `+pgx.Identifier{leaf}.Sanitize()+` CONCURRENTLY`)
		detached <- err
	}()
	require.Eventually(t, func() bool {
		var pending bool
		err := b.pool.QueryRow(b.ctx, `SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = $1::regclass`, leaf).Scan(&pending)
		return err == nil && pending
	}, 10*time.Second, 10*time.Millisecond, "the detach marks the leaf pending")
	var cancelled bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pg_cancel_backend($1)`, pid).Scan(&cancelled))
	require.True(t, cancelled)
	require.Error(t, <-detached, "the detach waits for the reader until cancelled")
}

// Each kind with a lifetime has its own class of leaves, as wide as its
// lifetime over LeavesPerLifetime; SetLifetimes refuses bad tables whole.
func TestSetLifetimes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	day := 24 * time.Hour
	table := []effects.Lifetime{{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}, {Kind: "api-request", Keep: day}}
	require.NoError(t, b.client.SetLifetimes(b.ctx, table, nil))
	require.Equal(t, 180*day/effects.LeavesPerLifetime, table[1].Width(0))
	require.Equal(t, day, table[2].Width(0))
	// A lifetime longer than two of the widest leaves is cut into more.
	require.Equal(t, effects.MaxLeafWidth, effects.Lifetime{Kind: "dispute", Keep: 5 * 365 * day}.Width(0))
	require.NoError(t, b.client.SetLifetimes(b.ctx, append(table, effects.Lifetime{Kind: "dispute", Keep: 5 * 365 * day}), nil))

	key := effects.MustKey("acme", "order", "k", "charge")
	_, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o"})
	require.NoError(t, err)
	var class string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT class FROM keyed_effects WHERE key = $1`, key.String()).Scan(&class))
	require.Equal(t, "charge", class)

	for _, bad := range [][]effects.Lifetime{
		{{Kind: "charge", Keep: day}},                                           // no "" row
		{{Kind: "", Keep: time.Minute}},                                         // under an hour
		{{Kind: "", Keep: day}, {Kind: "Bad Kind!", Keep: day}},                 // not a partition name
		{{Kind: "", Keep: day}, {Kind: "legacy", Keep: day}},                    // reserved
		{{Kind: "", Keep: day}, {Kind: "x", Keep: day}, {Kind: "x", Keep: day}}, // twice
	} {
		require.ErrorIs(t, b.client.SetLifetimes(b.ctx, bad, nil), effects.ErrLifetime, "%v", bad)
	}
	for _, width := range []time.Duration{-day, time.Minute, effects.MaxLeafWidth + day} {
		require.ErrorIs(t, b.client.SetLifetimes(b.ctx, table, &effects.SetLifetimesOpts{Width: width}), effects.ErrLifetime, "%s", width)
	}
	var keep time.Duration
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT keep FROM keyed_effect_lifetimes WHERE kind = ''`).Scan(&keep))
	require.Equal(t, 30*day, keep, "a refused table changes nothing")
}

// More leaves per lifetime make the leaves made from then on narrower,
// starting where the existing ones end; a key in a leaf of the old width
// is still a duplicate. SetLifetimes refuses a count out of range.
func TestLeavesPerLifetime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	day := 24 * time.Hour
	table := []effects.Lifetime{{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}}
	require.NoError(t, b.client.SetLifetimes(b.ctx, table, nil))
	_, err := b.client.EnsureLeaves(b.ctx, 180*day, 0)
	require.NoError(t, err)
	old := effects.MustKey("acme", "order", "old", "charge")
	_, err = b.pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, class, state, owner, result, finished_at, created_at)
		VALUES ($1, 'acme', 'charge', 'charge', 'succeeded', 'o', '{"id":"pi_old"}', now(), now() - interval '100 days')`, old.String())
	require.NoError(t, err)
	before := classLeaves(t, b, "charge")

	for _, n := range []int{-1, effects.MaxLeavesPerLifetime + 1} {
		err := b.client.SetLifetimes(b.ctx, table, &effects.SetLifetimesOpts{LeavesPerLifetime: n})
		require.ErrorIs(t, err, effects.ErrLifetime, "%d leaves per lifetime", n)
	}
	require.NoError(t, b.client.SetLifetimes(b.ctx, table, &effects.SetLifetimesOpts{LeavesPerLifetime: 12}))
	_, err = b.client.EnsureLeaves(b.ctx, 0, 120*day)
	require.NoError(t, err)
	after := classLeaves(t, b, "charge")
	require.Equal(t, before, after[:len(before)], "existing leaves keep their bounds")
	require.Greater(t, len(after), len(before)+1)
	for _, l := range after[len(before)+1:] {
		require.Equal(t, 15*day, l.To.Sub(l.From), "a new leaf is 180 days / 12 wide: %s", l.Name)
	}
	for _, l := range classLeaves(t, b, "default") {
		if l.From.After(before[len(before)-1].To) {
			require.Equal(t, 3*day, l.To.Sub(l.From), "30 days / 12, rounded up to whole days: %s", l.Name)
		}
	}

	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: old, Owner: "p"})
	require.NoError(t, err)
	require.True(t, cl.Done, "a key in a leaf of the old width is a duplicate")
	require.JSONEq(t, `{"id":"pi_old"}`, string(cl.Result))
}

func classLeaves(t *testing.T, b *bundle, class string) []effects.Leaf {
	t.Helper()
	leaves, err := b.client.Leaves(b.ctx)
	require.NoError(t, err)
	var out []effects.Leaf
	for _, l := range leaves {
		if l.Class == class {
			out = append(out, l)
		}
	}
	return out
}

// A kind given a class of its own after its records went to 'default'
// still finds them there; a kind with none there is set apart (its claim
// no longer looks in 'default') once its row is an hour old.
func TestKindGivenItsOwnClassFindsItsDefaultRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	day := 24 * time.Hour
	key := effects.MustKey("acme", "order", "early", "charge")
	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o"})
	require.NoError(t, err)
	require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "pi_early", Amount: 100}))

	table := []effects.Lifetime{{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}, {Kind: "receipt", Keep: 60 * day}}
	for range 2 {
		require.NoError(t, b.client.SetLifetimes(b.ctx, table, nil))
		again, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "late"})
		require.NoError(t, err)
		require.True(t, again.Done, "the record in 'default' holds the key")
		require.JSONEq(t, `{"id":"pi_early","amount":100}`, string(again.Result))
		// The next window, with the rows written two hours ago.
		_, err = b.pool.Exec(b.ctx, `UPDATE keyed_effect_lifetimes SET since = since - interval '2 hours'`)
		require.NoError(t, err)
	}
	apart := map[string]bool{}
	rows, err := b.pool.Query(b.ctx, `SELECT kind, apart FROM keyed_effect_lifetimes WHERE kind <> ''`)
	require.NoError(t, err)
	var kind string
	var isApart bool
	_, err = pgx.ForEachRow(rows, []any{&kind, &isApart}, func() error { apart[kind] = isApart; return nil })
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"charge": false, "receipt": true}, apart)
	require.Equal(t, 1, countKey(t, b, key))
}

// oldInstall returns a pool on a schema with the unpartitioned table of
// effects migration 1 holding n finished records, then migration 2 applied
// (a table with records keeps its layout).
func oldInstall(t *testing.T, n int) *pgxpool.Pool {
	t.Helper()
	_, url := effectstest.NewSchema(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 12
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	first := effects.Migrations()[0]
	_, err = pool.Exec(ctx, first.SQL)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE keyed_effects_migrations (line text NOT NULL, version integer NOT NULL,
		name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (line, version));
		INSERT INTO keyed_effects_migrations (line, version, name) VALUES ('main', 1, '001_create_keyed_effects.sql')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, state, owner, result, finished_at, created_at)
		SELECT 'acme:order:' || g || ':charge', 'acme', 'charge', 'succeeded', 'o', jsonb_build_object('id', 'pi_' || g),
			now() - interval '1 day', now() - interval '1 day' FROM generate_series(1, $1) g`, n)
	require.NoError(t, err)
	m, err := effects.NewMigrator(pool, quiet)
	require.NoError(t, err)
	_, err = m.Migrate(ctx)
	require.NoError(t, err)
	return pool
}

// legacySetup is setup on an unpartitioned table (an install before
// effects migration 2, not yet converted).
func legacySetup(t *testing.T) *bundle {
	t.Helper()
	pool := effectstest.NewPool(t, &effectstest.PoolOpts{Unpartitioned: true})
	return &bundle{ctx: context.Background(), pool: pool, client: effectstest.NewClient(t, pool, nil)}
}

// The online conversion: racers claim the same fresh keys before, during
// and after Partition, and every stored outcome replays afterwards. Each
// key has exactly one winner and one record.
func TestPartitionOnlineWithRacers(t *testing.T) {
	t.Parallel()
	const old = 5000
	pool := oldInstall(t, old)
	b := &bundle{ctx: context.Background(), pool: pool, client: effectstest.NewClient(t, pool, nil)}
	var relkind string
	require.NoError(t, pool.QueryRow(b.ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'keyed_effects'::regclass`).Scan(&relkind))
	require.Equal(t, "r", relkind, "a table with records is not converted by the migration")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := map[string]int{}
	var keys []effects.Key
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := effects.MustKey("acme", "order", fmt.Sprint("live", i), "charge")
			n := race(t, b, key, 8)
			mu.Lock()
			wins[key.String()], keys = n, append(keys, key)
			mu.Unlock()
		}
	})
	raced := func() int { mu.Lock(); defer mu.Unlock(); return len(keys) }
	// At least ten keys are raced before the conversion and ten after it,
	// however slowly a loaded machine runs them.
	require.Eventually(t, func() bool { return raced() >= 10 }, time.Minute, 10*time.Millisecond)
	converted, err := effects.Partition(b.ctx, pool)
	require.NoError(t, err)
	require.True(t, converted)
	after := raced() + 10
	require.Eventually(t, func() bool { return raced() >= after }, time.Minute, 10*time.Millisecond)
	close(stop)
	wg.Wait()

	for _, k := range keys {
		require.Equal(t, 1, wins[k.String()], k.String())
		require.Equal(t, 1, countKey(t, b, k), k.String())
	}
	for i := 1; i <= old; i += 499 {
		cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey("acme", "order", fmt.Sprint(i), "charge"), Owner: "x"})
		require.NoError(t, err)
		require.True(t, cl.Done)
		require.JSONEq(t, fmt.Sprintf(`{"id":"pi_%d"}`, i), string(cl.Result))
	}
	require.NoError(t, pool.QueryRow(b.ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'keyed_effects'::regclass`).Scan(&relkind))
	require.Equal(t, "p", relkind)
	again, err := effects.Partition(b.ctx, pool)
	require.NoError(t, err)
	require.False(t, again, "converting twice does nothing")
}

// A claim that finds no leaf for now (the retention window has not made
// it) makes the leaves itself and goes on; inside a transaction it fails as
// transient, having done nothing.
func TestClaimMakesAMissingLeaf(t *testing.T) {
	t.Parallel()
	b := setup(t)
	leaves, err := b.client.Leaves(b.ctx)
	require.NoError(t, err)
	for _, l := range leaves {
		_, err := b.pool.Exec(b.ctx, `DROP TABLE `+l.Name)
		require.NoError(t, err)
	}
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.client.ClaimTx(b.ctx, tx, effects.ClaimParams{Key: effects.MustKey("acme", "order", "tx", "charge"), Owner: "o"})
		return err
	})
	require.Error(t, err)
	require.True(t, effects.IsTransient(err), "%v", err)

	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey("acme", "order", "late", "charge"), Owner: "o"})
	require.NoError(t, err)
	require.False(t, cl.Done)
	leaves, err = b.client.Leaves(b.ctx)
	require.NoError(t, err)
	require.NotEmpty(t, leaves)
}

// A claim reads every leaf of its kind's classes by the key index, never
// by walking the (created_at, kind) index, whatever the leaves' statistics
// say: here they are empty, for a kind in one class ("receipt", in
// 'default') and for one still looked up in two ("charge", in its own
// class and 'default' until it is set apart). The session's plans are
// generic and made by the first claim, so a later claim locks only the
// indexes its plan reads.
func TestClaimReadsLeavesByKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	day := 24 * time.Hour
	table := []effects.Lifetime{{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}}
	require.NoError(t, b.client.SetLifetimes(b.ctx, table, nil))
	_, err := b.client.EnsureLeaves(b.ctx, 30*day, 0) // a lifetime's leaves
	require.NoError(t, err)
	conn, err := b.pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(b.ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(b.ctx, `RESET plan_cache_mode`) }()
	// The first claim plans, and the planner opens every index; so does a
	// claim whose plan an invalidation from a busy server's other sessions
	// threw away. A plan that reads another index reads it on every claim,
	// so one claim of a few reading only key indexes holds the plan to them.
	for _, kind := range []string{"receipt", "charge"} {
		var read [][]string // what each claim after the first read
		clean := false
		for i := 0; i < 5 && !clean; i++ {
			indexes := claimIndexes(t, b, conn, effects.MustKey("acme", "order", fmt.Sprint("k", i), kind))
			if i == 0 {
				continue
			}
			require.NotEmpty(t, indexes, kind)
			read = append(read, indexes)
			clean = !slices.ContainsFunc(indexes, func(ix string) bool { return !strings.HasSuffix(ix, "_key") })
		}
		require.True(t, clean, "every %s claim read an index other than a key index: %v", kind, read)
	}
}

// claimIndexes claims key on conn in a transaction it rolls back and
// returns the effect indexes the claim locked.
func claimIndexes(t *testing.T, b *bundle, conn *pgxpool.Conn, key effects.Key) []string {
	t.Helper()
	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Rollback(b.ctx)) }()
	_, err = b.client.ClaimTx(b.ctx, tx, effects.ClaimParams{Key: key, Owner: "o"})
	require.NoError(t, err)
	rows, err := tx.Query(b.ctx, `SELECT c.relname::text FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
		WHERE l.pid = pg_backend_pid() AND c.relkind = 'i' AND c.relname LIKE 'keyed_effects%'`)
	require.NoError(t, err)
	indexes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return indexes
}

// On a converted table Prune and PruneKind delete expired legacy records
// only. The leaves' records here are as old and as finished, and sit at the
// same row addresses in their leaf as the legacy ones in theirs: they stay.
func TestPruneOnAConvertedTableDeletesOnlyLegacyRecords(t *testing.T) {
	t.Parallel()
	prunes := map[string]func(context.Context, *effects.Client) (int64, error){
		"Prune": func(ctx context.Context, c *effects.Client) (int64, error) {
			return c.Prune(ctx, &effects.PruneOpts{Retention: time.Hour, BatchSize: 7})
		},
		"PruneKind": func(ctx context.Context, c *effects.Client) (int64, error) {
			return c.PruneKind(ctx, "charge", &effects.PruneKindOpts{Retention: time.Hour, BatchSize: 7})
		},
	}
	for name, prune := range prunes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const old = 50
			pool := oldInstall(t, old)
			b := &bundle{ctx: context.Background(), pool: pool, client: effectstest.NewClient(t, pool, nil)}
			converted, err := effects.Partition(b.ctx, pool)
			require.NoError(t, err)
			require.True(t, converted)
			_, err = b.client.EnsureLeaves(b.ctx, 3*24*time.Hour, 0)
			require.NoError(t, err)
			_, err = pool.Exec(b.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, class, state, owner, result, created_at, finished_at)
				SELECT 'acme:order:leaf' || g || ':charge', 'acme', 'charge', 'default', 'succeeded', 'o', '{}',
					now() - interval '2 days', now() - interval '2 days' FROM generate_series(1, $1) g`, old)
			require.NoError(t, err)
			var shared int
			require.NoError(t, pool.QueryRow(b.ctx, `SELECT count(*) FROM keyed_effects l JOIN keyed_effects d
				ON l.ctid = d.ctid AND l.class = 'legacy' AND d.class = 'default'`).Scan(&shared))
			require.Equal(t, old, shared, "each leaf record shares its row address with a legacy one")

			n, err := prune(b.ctx, b.client)
			require.NoError(t, err)
			require.EqualValues(t, old, n)
			var legacy, leaves int
			require.NoError(t, pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE class = 'legacy'), count(*) FILTER (WHERE class = 'default')
				FROM keyed_effects`).Scan(&legacy, &leaves))
			require.Zero(t, legacy)
			require.Equal(t, old, leaves)
		})
	}
}

// Get finds a record in the classes of its key's last part, and a record
// claimed under another kind (here "charge" for a key ending in "payment")
// in the other classes; a key with no record is not found.
func TestGetFindsARecordClaimedUnderAnotherKind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	day := 24 * time.Hour
	require.NoError(t, b.client.SetLifetimes(b.ctx, []effects.Lifetime{{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}}, nil))
	own := effects.MustKey("acme", "order", "1", "charge")
	other := effects.MustKey("acme", "order", "1", "payment")
	for key, kind := range map[effects.Key]string{own: "", other: "charge"} {
		cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Kind: kind, Owner: "o"})
		require.NoError(t, err)
		require.NoError(t, b.client.Complete(b.ctx, cl, outcome{}))
	}
	for _, key := range []effects.Key{own, other} {
		rec, err := b.client.Get(b.ctx, key)
		require.NoError(t, err, key.String())
		require.Equal(t, "charge", rec.Kind)
		require.Equal(t, effects.StateSucceeded, rec.State)
	}
	var class string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT class FROM keyed_effects WHERE key = $1`, other.String()).Scan(&class))
	require.Equal(t, "charge", class, "the record is where its kind put it, not in the classes of payment")
	_, err := b.client.Get(b.ctx, effects.MustKey("acme", "order", "2", "charge"))
	require.ErrorIs(t, err, effects.ErrNotFound)
}

// A claim told when its key was born (NotBefore) finds the key's record in
// a retained old leaf as long as the record is no older than an hour
// before that time, and 64 racers told so still give one winner.
func TestClaimWithNotBeforeFindsItsKey(t *testing.T) {
	t.Parallel()
	b := raceSetup(t)
	key := finishedTenDaysAgo(t, b, "born", "pi_born")
	born := time.Now().Add(-10*24*time.Hour + 30*time.Minute) // the record is half an hour older

	again, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "other", NotBefore: born})
	require.NoError(t, err)
	require.True(t, again.Done)
	require.JSONEq(t, `{"id":"pi_born","amount":700}`, string(again.Result))

	fresh := effects.MustKey("acme", "order", "born-fresh", "charge")
	wins := raceWith(t, b, effects.ClaimParams{Key: fresh, NotBefore: time.Now().Add(-time.Minute)}, 64)
	require.Equal(t, 1, wins)
	require.Equal(t, 1, countKey(t, b, fresh))
}

// NotBefore is trusted: a record older than an hour before it is not
// looked for. This is why NotBefore must be when a record the key derives
// from was created, never a time taken at the claim.
func TestClaimWithNotBeforeSkipsOlderLeaves(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := finishedTenDaysAgo(t, b, "misdated", "pi_old")

	late, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o", NotBefore: time.Now().Add(-24 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, late.Mode, "the ten-day-old record is in a leaf the bound rules out")
	require.Equal(t, 2, countKey(t, b, key))
}

// A NotBefore more than an hour later than the claim is refused before
// anything is written; one a few minutes ahead (clocks that differ) is
// taken as the claim's own time.
func TestClaimRefusesALateNotBefore(t *testing.T) {
	t.Parallel()
	bothLayouts(t, func(t *testing.T, b *bundle, plain bool) {
		key := effects.MustKey("acme", "order", "future", "charge")
		_, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o", NotBefore: time.Now().Add(2 * time.Hour)})
		require.ErrorIs(t, err, effects.ErrLateNotBefore)
		require.Equal(t, 0, countKey(t, b, key))

		cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o", NotBefore: time.Now().Add(5 * time.Minute)})
		require.NoError(t, err)
		require.Equal(t, effects.ModeNew, cl.Mode)
		require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "pi_1"}))
		if !plain {
			_, err = b.client.EnsureLeaves(b.ctx, 48*time.Hour, 0) // 50 minutes ago may be yesterday
			require.NoError(t, err)
			backdate(t, b, key, 50*time.Minute)
		}
		again, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o2", NotBefore: time.Now().Add(5 * time.Minute)})
		require.NoError(t, err)
		require.True(t, again.Done, "a bound ahead of the claim looks from an hour before the claim")
	})
}

// bothLayouts runs test on the partitioned layout and on an unpartitioned
// table, each a parallel subtest on a fresh schema.
func bothLayouts(t *testing.T, test func(t *testing.T, b *bundle, plain bool)) {
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprint("unpartitioned=", plain), func(t *testing.T) {
			t.Parallel()
			pool := effectstest.NewPool(t, &effectstest.PoolOpts{Unpartitioned: plain})
			test(t, &bundle{ctx: context.Background(), pool: pool, client: effectstest.NewClient(t, pool, nil)}, plain)
		})
	}
}

// Code from before effects migration 5 calls the seven-argument claim: on
// either layout it still claims, and finds a key anywhere.
func TestSevenArgumentClaimStillWorks(t *testing.T) {
	t.Parallel()
	bothLayouts(t, func(t *testing.T, b *bundle, plain bool) {
		key := effects.MustKey("acme", "order", "old-code", "charge")
		cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o"})
		require.NoError(t, err)
		require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "pi_1", Amount: 1}))
		if !plain {
			_, err = b.client.EnsureLeaves(b.ctx, 11*24*time.Hour, 0)
			require.NoError(t, err)
			backdate(t, b, key, 10*24*time.Hour)
		}
		var inserted bool
		var state string
		err = b.pool.QueryRow(b.ctx, `SELECT inserted, state FROM keyed_effects_claim($1, 'acme', 'charge', 'x', '', 1000000, false)`,
			key.String()).Scan(&inserted, &state)
		require.NoError(t, err)
		require.False(t, inserted)
		require.Equal(t, string(effects.StateSucceeded), state)
	})
}

// insertFirstSetup is raceSetup with the kind "archive" in a class of its
// own, whose leaves are replaced by one from 30 days back to 30 days ahead:
// a claim told a second ago has its window inside that leaf at any hour.
func insertFirstSetup(t *testing.T) *bundle {
	t.Helper()
	b := raceSetup(t)
	lifetimes := []effects.Lifetime{{Kind: "", Keep: effects.DefaultRetention}, {Kind: "archive", Keep: 180 * 24 * time.Hour}}
	require.NoError(t, b.client.SetLifetimes(b.ctx, lifetimes, nil))
	// Lifetimes older than an hour: the kind no longer looks in the default class.
	_, err := b.pool.Exec(b.ctx, `UPDATE keyed_effect_lifetimes SET since = since - interval '2 hours'`)
	require.NoError(t, err)
	require.NoError(t, b.client.SetLifetimes(b.ctx, lifetimes, nil))
	leaves, err := b.client.Leaves(b.ctx)
	require.NoError(t, err)
	for _, l := range leaves {
		if l.Class == "archive" {
			_, err := b.pool.Exec(b.ctx, fmt.Sprintf(`DROP TABLE %q`, l.Name))
			require.NoError(t, err)
		}
	}
	lo := time.Now().UTC().Truncate(time.Hour).Add(-30 * 24 * time.Hour)
	_, err = b.pool.Exec(b.ctx, fmt.Sprintf(`
CREATE TABLE keyed_effects_archive_wide (LIKE keyed_effects INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
CREATE UNIQUE INDEX keyed_effects_archive_wide_key ON keyed_effects_archive_wide (key);
CREATE INDEX keyed_effects_archive_wide_created ON keyed_effects_archive_wide (created_at, kind);
ALTER TABLE keyed_effects_archive ATTACH PARTITION keyed_effects_archive_wide FOR VALUES FROM ('%s') TO ('%s');
SELECT keyed_effects_refresh_claim();`, lo.Format(time.RFC3339), lo.Add(60*24*time.Hour).Format(time.RFC3339)))
	require.NoError(t, err)
	return b
}

func claimSource(t *testing.T, b *bundle) string {
	t.Helper()
	var src string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT prosrc FROM pg_proc
		WHERE oid = to_regprocedure('keyed_effects_claim(text,text,text,text,text,bigint,boolean,timestamptz)')`).Scan(&src))
	return src
}

// Inside one leaf a told claim inserts first and reads the record only on
// a conflict: one winner among 64 racers, and a repeat finds the record by
// the leaf's unique index, even one created before the window the bound
// gives (a look-up first would miss it and fail on that index).
func TestToldClaimInsertsFirstInsideOneLeaf(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	require.Contains(t, claimSource(t, b), "INSERT INTO keyed_effects_archive_wide AS e (key, tenant_id, kind, class, state, owner, fingerprint, lease_until) "+
		"VALUES (p_key, p_tenant, p_kind, 'archive', 'claimed', p_owner, p_fingerprint, now() + p_lease_us * interval '1 microsecond') ON CONFLICT DO NOTHING")

	told := func(key effects.Key) effects.ClaimParams {
		return effects.ClaimParams{Key: key, NotBefore: time.Now().Add(-time.Second)}
	}
	fresh := effects.MustKey("acme", "doc", "raced", "archive")
	require.Equal(t, 1, raceWith(t, b, told(fresh), 64))
	require.Equal(t, 1, countKey(t, b, fresh))

	key := effects.MustKey("acme", "doc", "kept", "archive")
	p := told(key)
	p.Owner = "first"
	cl, err := b.client.Claim(b.ctx, p)
	require.NoError(t, err)
	require.Equal(t, effects.ModeNew, cl.Mode)
	require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "doc_1", Amount: 1}))
	backdate(t, b, key, 2*time.Hour)
	p = told(key)
	p.Owner = "second"
	again, err := b.client.Claim(b.ctx, p)
	require.NoError(t, err)
	require.True(t, again.Done)
	require.JSONEq(t, `{"id":"doc_1","amount":1}`, string(again.Result))
	require.Equal(t, 1, countKey(t, b, key))
}

// The claim names the current and future leaves it inserts into first;
// EnsureLeaves writes it again when it makes new ones.
func TestEnsureLeavesRewritesTheClaim(t *testing.T) {
	t.Parallel()
	b := insertFirstSetup(t)
	made, err := b.client.EnsureLeaves(b.ctx, 0, 30*24*time.Hour)
	require.NoError(t, err)
	require.NotEmpty(t, made)
	leaves, err := b.client.Leaves(b.ctx)
	require.NoError(t, err)
	src := claimSource(t, b)
	for _, l := range leaves {
		if l.Name == made[len(made)-1] {
			require.Contains(t, src, "'"+l.From.UTC().Format("2006-01-02T15:04:05.000000Z")+"'::timestamptz", l.Name)
			return
		}
	}
	t.Fatalf("no leaf named %s in %v", made[len(made)-1], leaves)
}
