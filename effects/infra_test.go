package effects_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

func TestIsInfrastructure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("complete: %w", io.ErrUnexpectedEOF), true},
		{io.EOF, true},
		{pgconn.ErrConnClosed, true},
		{&pgconn.PgError{Code: "57P01"}, true}, // admin shutdown
		{&pgconn.PgError{Code: "57P03"}, true}, // cannot connect now
		{&pgconn.PgError{Code: "57014"}, true}, // statement timeout
		{&pgconn.PgError{Code: "40001"}, true}, // serialization failure
		{&pgconn.PgError{Code: "40P01"}, true}, // deadlock detected
		{&pgconn.PgError{Code: "08006"}, true}, // connection failure
		{&pgconn.PgError{Code: "55P03"}, true}, // lock not available
		{context.DeadlineExceeded, true},
		{&pgconn.PgError{Code: "23505"}, false}, // unique violation
		{&pgconn.PgError{Code: "42P01"}, false}, // undefined table
		{errors.New("card declined"), false},
		{nil, false},
	} {
		require.Equal(t, tc.want, effects.IsInfrastructure(tc.err), "%v", tc.err)
		require.Equal(t, tc.want, effects.IsTransient(tc.err), "%v", tc.err)
	}
}

// failingDB makes every statement that contains match fail with err, as a
// connection lost mid-query does.
type failingDB struct {
	effects.DB
	match string
	err   error
}

func (f failingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if strings.Contains(sql, f.match) {
		return pgconn.CommandTag{}, f.err
	}
	return f.DB.Exec(ctx, sql, args...)
}

func (f failingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return f.DB.QueryRow(ctx, sql, args...)
}

// TestDoStoringOutcomeFailsIsTransientAndReentrant: the effect happened but
// its outcome could not be stored. The error is transient, the claim stays
// with its owner, and the retry re-enters it to find the provider's result.
func TestDoStoringOutcomeFailsIsTransientAndReentrant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	broken, err := effects.NewClient(failingDB{DB: b.pool, match: "state = 'succeeded'", err: fmt.Errorf("write: %w", io.ErrUnexpectedEOF)}, nil)
	require.NoError(t, err)
	key := effects.MustKey("acme", "order", "1", "charge")
	p := effects.ClaimParams{Key: key, Owner: "wf-1/charge"}

	_, err = effects.Do(b.ctx, broken, p, func(context.Context, *effects.Claim) (outcome, error) {
		return outcome{ID: "pi_1"}, nil
	}, nil)
	require.Error(t, err)
	require.True(t, effects.IsTransient(err), "a lost connection while storing the outcome is retried: %v", err)
	require.Equal(t, effects.StateClaimed, b.record(t, key).State)

	var mode effects.Mode
	got, err := effects.Do(b.ctx, b.client, p, func(_ context.Context, c *effects.Claim) (outcome, error) {
		mode = c.Mode
		return outcome{ID: "pi_1"}, nil // The provider's own record of the first attempt.
	}, nil)
	require.NoError(t, err)
	require.Equal(t, effects.ModeReentry, mode)
	require.Equal(t, "pi_1", got.ID)
}

// TestDoTerminalFailureNotStoredIsTransient: fn failed for good but the
// failure could not be recorded; the attempt is retried rather than
// reported terminal over a record that still says claimed.
func TestDoTerminalFailureNotStoredIsTransient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	broken, err := effects.NewClient(failingDB{DB: b.pool, match: "SET state = $3", err: &pgconn.PgError{Code: "57P01"}}, nil)
	require.NoError(t, err)
	key := effects.MustKey("acme", "order", "2", "charge")
	_, err = effects.Do(b.ctx, broken, effects.ClaimParams{Key: key, Owner: "wf-2/charge"}, func(context.Context, *effects.Claim) (outcome, error) {
		return outcome{}, effects.NewCodedError("card_declined", "declined")
	}, nil)
	require.True(t, effects.IsTransient(err), "%v", err)
	require.Equal(t, effects.StateClaimed, b.record(t, key).State)
}
