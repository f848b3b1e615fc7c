package effects_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
)

type bundle struct {
	ctx     context.Context
	pool    *pgxpool.Pool
	client  *effects.Client
	metrics *effects.Metrics
}

// setupConns is the pool size of setup's bundle: as many claims race on
// their own connections as this, and the package's two parallel tests
// together stay well inside Postgres's 100 connections while other test
// packages (and other people's demos) use the same server.
const setupConns = 24

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := effectstest.NewPool(t, &effectstest.PoolOpts{MaxConns: setupConns})
	metrics, err := effects.NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	return &bundle{
		ctx:     context.Background(),
		pool:    pool,
		client:  effectstest.NewClient(t, pool, &effects.ClientOpts{Metrics: metrics}),
		metrics: metrics,
	}
}

// expire moves a claim's lease into the past, as if its owner died.
func (b *bundle) expire(t *testing.T, key effects.Key) {
	t.Helper()
	tag, err := b.pool.Exec(b.ctx, `UPDATE keyed_effects SET lease_until = now() - interval '1 second' WHERE key = $1`, key.String())
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

func (b *bundle) record(t *testing.T, key effects.Key) *effects.Record {
	t.Helper()
	rec, err := b.client.Get(b.ctx, key)
	require.NoError(t, err)
	return rec
}

type outcome struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

func TestClaimNewThenReplayStoredResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "order", "9f3a", "charge")

	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "wf-1/charge"})
	require.NoError(t, err)
	require.False(t, cl.Done)
	require.Equal(t, effects.ModeNew, cl.Mode)
	require.Equal(t, "charge", cl.Kind)
	require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "pi_1", Amount: 500}))

	again, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "someone-else"})
	require.NoError(t, err)
	require.True(t, again.Done)
	var got outcome
	require.NoError(t, again.Decode(&got))
	require.Equal(t, outcome{ID: "pi_1", Amount: 500}, got)
	require.Equal(t, 1.0, testutil.ToFloat64(metricVec(t, b, "suppressed").WithLabelValues("charge")))
	require.Equal(t, 1, testutil.CollectAndCount(effects.MetricsCollectorForTest(b.metrics, "duplicate_age"), "keyed_effect_duplicate_age_seconds"))

	rec := b.record(t, key)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.Nil(t, rec.LeaseUntil)
	require.NotNil(t, rec.FinishedAt)
}

func TestClaimInProgressForOtherOwnerReentryForSameOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "order", "1", "charge")

	first, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "wf-1/charge"})
	require.NoError(t, err)

	_, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "wf-2/charge"})
	require.ErrorIs(t, err, effects.ErrInProgress)
	require.True(t, effects.IsTransient(err))
	var ip *effects.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Equal(t, "wf-1/charge", ip.Owner)

	again, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "wf-1/charge"})
	require.NoError(t, err)
	require.Equal(t, effects.ModeReentry, again.Mode)
	require.Equal(t, first.Generation+1, again.Generation)
	require.Equal(t, 2, again.Attempt)

	// The earlier attempt is fenced off: its generation is gone.
	require.ErrorIs(t, b.client.Complete(b.ctx, first, outcome{}), effects.ErrLeaseLost)
	require.ErrorIs(t, b.client.Extend(b.ctx, first, 0), effects.ErrLeaseLost)
	require.NoError(t, b.client.Complete(b.ctx, again, outcome{ID: "pi_2"}))
}

func TestClaimExpiredLeaseTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "order", "2", "charge")
	dead, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "dead"})
	require.NoError(t, err)
	b.expire(t, key)

	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "alive"})
	require.NoError(t, err)
	require.Equal(t, effects.ModeTakeover, cl.Mode)
	require.Equal(t, 1.0, testutil.ToFloat64(metricVec(t, b, "takeovers").WithLabelValues("charge")))
	require.ErrorIs(t, b.client.Complete(b.ctx, dead, outcome{}), effects.ErrLeaseLost)
	require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "pi"}))
}

func TestClaimTakeoverRaceExactlyOneWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for round := 0; round < 20; round++ {
		key := effects.MustKey("acme", "order", fmt.Sprint(round), "charge")
		_, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "dead"})
		require.NoError(t, err)
		b.expire(t, key)

		const racers = 16
		var wg sync.WaitGroup
		results := make(chan error, racers)
		wins := make(chan *effects.Claim, racers)
		for i := 0; i < racers; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: fmt.Sprintf("racer-%d", i)})
				if err == nil {
					wins <- cl
				}
				results <- err
			}(i)
		}
		wg.Wait()
		close(results)
		close(wins)
		require.Len(t, wins, 1, "round %d", round)
		for err := range results {
			if err != nil {
				require.ErrorIs(t, err, effects.ErrInProgress)
			}
		}
		w := <-wins
		require.Equal(t, effects.ModeTakeover, w.Mode)
	}
}

func TestClaimConcurrentFreshKeyExactlyOneAcquires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const goroutines, rounds = setupConns, 40
	for round := 0; round < rounds; round++ {
		key := effects.MustKey("acme", "order", fmt.Sprintf("c%d", round), "charge")
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		acquired, done, inProgress := 0, 0, 0
		for i := 0; i < goroutines; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				res, err := effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key, Owner: fmt.Sprintf("w%d", i)},
					func(ctx context.Context, cl *effects.Claim) (outcome, error) {
						mu.Lock()
						acquired++
						mu.Unlock()
						return outcome{ID: "pi_" + key.String()}, nil
					}, nil)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					require.Equal(t, "pi_"+key.String(), res.ID)
					done++
				case errors.Is(err, effects.ErrInProgress):
					inProgress++
				default:
					t.Errorf("unexpected error: %v", err)
				}
			}(i)
		}
		close(start)
		wg.Wait()
		require.Equal(t, 1, acquired, "round %d: effect ran %d times", round, acquired)
		require.Equal(t, goroutines, done+inProgress)
	}
}

func TestTransientFailureReclaimsTerminalFailureReplays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "order", "3", "charge")

	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o"})
	require.NoError(t, err)
	require.NoError(t, b.client.Fail(b.ctx, cl, effects.Transient(errors.New("connection reset"))))
	require.Equal(t, effects.StateFailedTransient, b.record(t, key).State)

	// Any owner may retry a transient failure at once.
	cl, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "other"})
	require.NoError(t, err)
	require.Equal(t, effects.ModeRetry, cl.Mode)
	require.NoError(t, b.client.Fail(b.ctx, cl, effects.NewCodedError("card_declined", "Your card was declined.")))

	_, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o"})
	require.ErrorIs(t, err, effects.ErrTerminal)
	var te *effects.TerminalError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "card_declined", te.Code)
	require.False(t, effects.IsTransient(err))

	rec := b.record(t, key)
	require.Equal(t, effects.StateFailedTerminal, rec.State)
	require.Equal(t, 2, rec.Attempts)
}

func TestUnclassifiedErrorIsTerminal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "x", "charge")
	calls := 0
	fn := func(ctx context.Context, cl *effects.Claim) (outcome, error) {
		calls++
		return outcome{}, errors.New("something odd")
	}
	_, err := effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key, Owner: "o"}, fn, nil)
	require.EqualError(t, err, "something odd")
	_, err = effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key, Owner: "o"}, fn, nil)
	require.ErrorIs(t, err, effects.ErrTerminal)
	require.Equal(t, 1, calls)
	require.Equal(t, "unclassified", b.record(t, key).ErrorCode)
}

func TestFingerprintMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "order", "4", "charge")
	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o", Fingerprint: "amount=500,eur"})
	require.NoError(t, err)
	require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: "pi"}))

	_, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o", Fingerprint: "amount=900,eur"})
	require.ErrorIs(t, err, effects.ErrKeyReused)
	require.False(t, effects.IsTransient(err))
	require.Equal(t, 1.0, testutil.ToFloat64(metricVec(t, b, "mismatch").WithLabelValues("charge")))

	same, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "o", Fingerprint: "amount=500,eur"})
	require.NoError(t, err)
	require.True(t, same.Done)
}

func TestCompleteTxRollbackLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE side (id text PRIMARY KEY)`)
	require.NoError(t, err)
	key := effects.MustKey("acme", "order", "5", "mark_paid")

	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = effects.DoTx(b.ctx, b.client, tx, effects.ClaimParams{Key: key, Owner: "o"},
		func(ctx context.Context, tx pgx.Tx, cl *effects.Claim) (string, error) {
			_, err := tx.Exec(ctx, `INSERT INTO side VALUES ('x')`)
			return "paid", err
		})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(b.ctx))

	_, err = b.client.Get(b.ctx, key)
	require.ErrorIs(t, err, effects.ErrNotFound)
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM side`).Scan(&n))
	require.Zero(t, n)

	// Committed, the effect and its record land together, and a second
	// transaction replays instead of writing again.
	for i := 0; i < 2; i++ {
		err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			res, err := effects.DoTx(b.ctx, b.client, tx, effects.ClaimParams{Key: key, Owner: "o"},
				func(ctx context.Context, tx pgx.Tx, cl *effects.Claim) (string, error) {
					_, err := tx.Exec(ctx, `INSERT INTO side VALUES ('x')`)
					return "paid", err
				})
			require.Equal(t, "paid", res)
			return err
		})
		require.NoError(t, err)
	}
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM side`).Scan(&n))
	require.Equal(t, 1, n)
	require.Equal(t, effects.StateSucceeded, b.record(t, key).State)
}

func TestPrune(t *testing.T) {
	t.Parallel()
	b := legacySetup(t)
	old := effects.MustKey("acme", "old", "charge")
	fresh := effects.MustKey("acme", "fresh", "charge")
	live := effects.MustKey("acme", "live", "charge")
	expired := effects.MustKey("acme", "expired", "charge")
	for _, k := range []effects.Key{old, fresh} {
		cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: k, Owner: "o"})
		require.NoError(t, err)
		require.NoError(t, b.client.Complete(b.ctx, cl, outcome{}))
	}
	for _, k := range []effects.Key{live, expired} {
		_, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: k, Owner: "o"})
		require.NoError(t, err)
	}
	// Age everything well past retention; the claims must still survive.
	_, err := b.pool.Exec(b.ctx, `UPDATE keyed_effects SET created_at = now() - interval '40 days',
		finished_at = CASE WHEN state = 'claimed' THEN NULL ELSE now() - interval '40 days' END WHERE key <> $1`, fresh.String())
	require.NoError(t, err)
	b.expire(t, expired)

	_, err = b.client.Prune(b.ctx, &effects.PruneOpts{Retention: time.Minute})
	require.ErrorContains(t, err, "under one hour")

	n, err := b.client.Prune(b.ctx, &effects.PruneOpts{BatchSize: 1})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = b.client.Get(b.ctx, old)
	require.ErrorIs(t, err, effects.ErrNotFound)
	for _, k := range []effects.Key{fresh, live, expired} {
		b.record(t, k)
	}
}

func TestDoHeartbeatAndLostLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "order", "6", "charge")
	beats := 0
	_, err := effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key, Owner: "o", Lease: 3 * time.Second},
		func(ctx context.Context, cl *effects.Claim) (outcome, error) {
			// Someone takes the claim over while we work.
			_, err := b.pool.Exec(ctx, `UPDATE keyed_effects SET generation = generation + 1, owner = 'thief' WHERE key = $1`, key.String())
			require.NoError(t, err)
			<-ctx.Done()
			return outcome{}, ctx.Err()
		}, &effects.DoOpts{ExtendEvery: 50 * time.Millisecond, Heartbeat: func(context.Context) { beats++ }})
	require.ErrorIs(t, err, effects.ErrLeaseLost)
	rec := b.record(t, key)
	require.Equal(t, effects.StateClaimed, rec.State, "a lost lease must not record a failure over the new owner's claim")
	require.Equal(t, "thief", rec.Owner)

	key2 := effects.MustKey("acme", "order", "7", "charge")
	_, err = effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key2, Owner: "o", Lease: 3 * time.Second},
		func(ctx context.Context, cl *effects.Claim) (outcome, error) {
			time.Sleep(250 * time.Millisecond)
			return outcome{ID: "ok"}, nil
		}, &effects.DoOpts{ExtendEvery: 50 * time.Millisecond, Heartbeat: func(context.Context) { beats++ }})
	require.NoError(t, err)
	require.Positive(t, beats)
}

func TestDoAtMostOnceDoesNotRepeatAnAmbiguousSend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "order", "8", "receipt")
	// An attempt claimed the send and died before reporting back.
	_, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: key, Owner: "wf/receipt"})
	require.NoError(t, err)

	sends := 0
	send := func(ctx context.Context, cl *effects.Claim) (string, error) { sends++; return "sent", nil }
	_, err = effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key, Owner: "wf/receipt"}, send, &effects.DoOpts{AtMostOnce: true})
	require.ErrorIs(t, err, effects.ErrAmbiguous)
	require.Zero(t, sends)
	rec := b.record(t, key)
	require.Equal(t, effects.StateFailedTerminal, rec.State)
	require.Equal(t, "ambiguous", rec.ErrorCode)

	// A send that failed transiently (known not to have gone out) is retried.
	key2 := effects.MustKey("acme", "order", "9", "receipt")
	fail := func(ctx context.Context, cl *effects.Claim) (string, error) {
		return "", effects.Transient(errors.New("429"))
	}
	_, err = effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key2, Owner: "wf/receipt"}, fail, &effects.DoOpts{AtMostOnce: true})
	require.True(t, effects.IsTransient(err))
	got, err := effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key2, Owner: "wf/receipt"}, send, &effects.DoOpts{AtMostOnce: true})
	require.NoError(t, err)
	require.Equal(t, "sent", got)
	require.Equal(t, 1, sends)
}

// An asynchronously committed claim may be lost in a crash, which would
// let a later attempt send again: Do refuses it with AtMostOnce, before
// claiming anything.
func TestDoRefusesAsyncCommitWithAtMostOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := effects.MustKey("acme", "order", "10", "receipt")
	send := func(ctx context.Context, cl *effects.Claim) (string, error) { return "sent", nil }
	_, err := effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key, Owner: "wf/receipt", AsyncCommit: true},
		send, &effects.DoOpts{AtMostOnce: true})
	require.ErrorContains(t, err, "AsyncCommit with AtMostOnce")
	_, err = b.client.Get(b.ctx, key)
	require.ErrorIs(t, err, effects.ErrNotFound, "nothing was claimed")
}

func TestCompleteRefusesPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey("acme", "big", "receipt"), Owner: "o"})
	require.NoError(t, err)
	err = b.client.Complete(b.ctx, cl, map[string]string{"body": string(make([]byte, effects.MaxResultBytes))})
	require.ErrorIs(t, err, effects.ErrResultTooLarge)
}

func TestListIsTenantScoped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tenant := range []string{"acme", "globex"} {
		for _, step := range []string{"charge", "receipt"} {
			cl, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey(tenant, "order", "1", step), Owner: "o"})
			require.NoError(t, err)
			require.NoError(t, b.client.Complete(b.ctx, cl, outcome{ID: tenant}))
		}
	}
	recs, err := b.client.List(b.ctx, effects.MustKey("acme", "order", "1"))
	require.NoError(t, err)
	require.Len(t, recs, 2)
	for _, r := range recs {
		require.Equal(t, "acme", r.TenantID)
	}
	recs, err = b.client.List(b.ctx, effects.MustKey("acme", "order"))
	require.NoError(t, err)
	require.Len(t, recs, 2)
}

// ListTx reads through the caller's transaction: it sees the
// transaction's own uncommitted records, and on a pool of one connection
// it needs no second one.
func TestListTxReadsThroughTheTransaction(t *testing.T) {
	t.Parallel()
	pool := effectstest.NewPool(t, &effectstest.PoolOpts{MaxConns: 1})
	client := effectstest.NewClient(t, pool, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	prefix := effects.MustKey("acme", "order", "1")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cl, err := client.ClaimTx(ctx, tx, effects.ClaimParams{Key: effects.MustKey("acme", "order", "1", "charge"), Owner: "o"})
		require.NoError(t, err)
		require.NoError(t, client.CompleteTx(ctx, tx, cl, outcome{ID: "pi_1"}))
		recs, err := client.ListTx(ctx, tx, prefix)
		require.NoError(t, err)
		require.Len(t, recs, 1, "the transaction's own record")
		require.Equal(t, effects.StateSucceeded, recs[0].State)
		return errors.New("roll back")
	})
	require.EqualError(t, err, "roll back")
	recs, err := client.List(ctx, prefix)
	require.NoError(t, err)
	require.Empty(t, recs, "rolled back with the transaction")
}

func TestClaimRejectsBadParams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.client.Claim(b.ctx, effects.ClaimParams{Owner: "o"})
	require.ErrorIs(t, err, effects.ErrInvalidKey)
	_, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: effects.MustKey("a", "b")})
	require.ErrorContains(t, err, "owner is empty")
	_, err = effects.NewClient(b.pool, &effects.ClientOpts{Lease: time.Millisecond})
	require.Error(t, err)
	_, err = effects.NewClient(nil, nil)
	require.Error(t, err)
}

func metricVec(t *testing.T, b *bundle, name string) *prometheus.CounterVec {
	t.Helper()
	return effects.MetricsCounterForTest(b.metrics, name)
}
