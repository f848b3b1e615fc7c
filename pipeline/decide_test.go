package pipeline_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/activities"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/pipeline"
)

// ambiguousRecord leaves key's record failed as ambiguous: an at-most-once
// send whose first attempt's claim was re-entered.
func ambiguousRecord(t *testing.T, c *effects.Client, key effects.Key) {
	t.Helper()
	ctx := context.Background()
	p := effects.ClaimParams{Key: key, Owner: "shipment:acme:s1/notify"}
	_, err := c.Claim(ctx, p)
	require.NoError(t, err)
	_, err = effects.Do(ctx, c, p, func(context.Context, *effects.Claim) (string, error) { return "msg", nil },
		&effects.DoOpts{AtMostOnce: true})
	require.ErrorIs(t, err, effects.ErrAmbiguous)
}

// ApplyDecision settles the decided record with effects.Resolve, keeps who
// decided and why, is idempotent, and refuses what cannot be resolved.
func TestApplyDecisionResolvesTheRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := effectstest.NewClient(t, dbtest.NewPool(t), &effects.ClientOpts{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	d, err := pipeline.NewDecider(c)
	require.NoError(t, err)
	_, err = pipeline.NewDecider(nil)
	require.Error(t, err)

	done := effects.MustKey("acme", "shipment", "s1", "notify")
	ambiguousRecord(t, c, done)
	in := pipeline.DecisionInput{EffectKey: done.String(), Step: "notify", Resolution: effects.ResolveDone,
		Result: json.RawMessage(`{"message_id":"msg_1"}`), Reason: "found at the provider", By: "ada",
		WorkflowID: "shipment:acme:s1", RunID: "run-1"}
	res, err := d.ApplyDecision(ctx, in)
	require.NoError(t, err)
	require.Equal(t, string(effects.StateSucceeded), res.State)
	require.Positive(t, res.Generation)
	rec, err := c.Get(ctx, done)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.JSONEq(t, `{"message_id":"msg_1"}`, string(rec.Result))
	require.Contains(t, rec.ErrorMessage, "ada decided done via the decide update of run run-1: found at the provider")
	again, err := d.ApplyDecision(ctx, in)
	require.NoError(t, err, "applying the same decision twice leaves the record as once")
	require.Equal(t, res.Generation, again.Generation)

	// A retry of a record that succeeded is refused for good.
	in.Resolution, in.Result = effects.ResolveRetry, nil
	_, err = d.ApplyDecision(ctx, in)
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, activities.ErrTypeInvalidState, app.Type())
	require.True(t, app.NonRetryable())

	// A retry of an effect never claimed has nothing to settle.
	never := effects.MustKey("acme", "shipment", "s2", "notify")
	res, err = d.ApplyDecision(ctx, pipeline.DecisionInput{EffectKey: never.String(), Step: "notify",
		Resolution: effects.ResolveRetry, Reason: "not at the provider", By: "ada"})
	require.NoError(t, err)
	require.Equal(t, "absent", res.State)
}
