package effects_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
)

func TestResolve(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var resolved []bool // each acting claim's Resolved
	send := func(key effects.Key, sends *int) (string, error) {
		return effects.Do(b.ctx, b.client, effects.ClaimParams{Key: key, Owner: "wf/receipt"},
			func(_ context.Context, cl *effects.Claim) (string, error) {
				resolved = append(resolved, cl.Resolved)
				*sends++
				return "msg-1", nil
			}, &effects.DoOpts{AtMostOnce: true})
	}

	// An ambiguous send, resolved as "retry" after the provider shows nothing
	// went out: the next run sends.
	retryKey := effects.MustKey("acme", "order", "r1", "receipt")
	_, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: retryKey, Owner: "wf/receipt"})
	require.NoError(t, err)
	sends := 0
	_, err = send(retryKey, &sends)
	require.ErrorIs(t, err, effects.ErrAmbiguous)
	rec, err := b.client.Resolve(b.ctx, retryKey, effects.ResolveParams{Resolution: effects.ResolveRetry, Reason: "SendGrid has no message for this key"})
	require.NoError(t, err)
	require.Equal(t, effects.StateFailedTransient, rec.State)
	require.Contains(t, rec.ErrorMessage, "SendGrid has no message")
	got, err := send(retryKey, &sends)
	require.NoError(t, err)
	require.Equal(t, "msg-1", got)
	require.Equal(t, 1, sends)
	require.Equal(t, []bool{true}, resolved, "the claim after an operator's retry says so")

	// An ambiguous send resolved as "done": later runs replay, never send.
	doneKey := effects.MustKey("acme", "order", "r2", "receipt")
	_, err = b.client.Claim(b.ctx, effects.ClaimParams{Key: doneKey, Owner: "wf/receipt"})
	require.NoError(t, err)
	_, err = send(doneKey, &sends)
	require.ErrorIs(t, err, effects.ErrAmbiguous)
	_, err = b.client.Resolve(b.ctx, doneKey, effects.ResolveParams{Resolution: effects.ResolveDone, Result: "msg-found", Reason: "found in SendGrid activity"})
	require.NoError(t, err)
	got, err = send(doneKey, &sends)
	require.NoError(t, err)
	require.Equal(t, "msg-found", got)
	require.Equal(t, 1, sends)

	// A succeeded record and a live claim cannot be overwritten.
	_, err = b.client.Resolve(b.ctx, doneKey, effects.ResolveParams{Resolution: effects.ResolveRetry, Reason: "oops"})
	require.ErrorIs(t, err, effects.ErrNotResolvable)
	live := effects.MustKey("acme", "order", "r3", "charge")
	held, err := b.client.Claim(b.ctx, effects.ClaimParams{Key: live, Owner: "alive"})
	require.NoError(t, err)
	_, err = b.client.Resolve(b.ctx, live, effects.ResolveParams{Resolution: effects.ResolveRetry, Reason: "x"})
	require.ErrorIs(t, err, effects.ErrNotResolvable)
	require.ErrorContains(t, err, "live lease")

	// An expired claim can be; its owner is fenced off.
	b.expire(t, live)
	_, err = b.client.Resolve(b.ctx, live, effects.ResolveParams{Resolution: effects.ResolveRetry, Reason: "owner gone"})
	require.NoError(t, err)
	require.ErrorIs(t, b.client.Complete(b.ctx, held, "late"), effects.ErrLeaseLost)

	// Bad input.
	_, err = b.client.Resolve(b.ctx, effects.MustKey("acme", "nope", "x"), effects.ResolveParams{Resolution: effects.ResolveRetry, Reason: "x"})
	require.ErrorIs(t, err, effects.ErrNotFound)
	_, err = b.client.Resolve(b.ctx, live, effects.ResolveParams{Resolution: effects.ResolveRetry})
	require.ErrorContains(t, err, "reason is required")
	_, err = b.client.Resolve(b.ctx, live, effects.ResolveParams{Resolution: "maybe", Reason: "x"})
	require.ErrorContains(t, err, "neither")
}
