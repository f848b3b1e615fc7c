package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
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

// notifyDef is the shipment's notify step as a worker registers it, with a
// Verify that returns verdict and records what it was asked.
func notifyDef(verdict *error, asked *[]string) step.Definition {
	def := declNotify.Bind(func(context.Context, shipInput) (notified, error) { return notified{}, nil })
	def.Verify = func(_ context.Context, key effects.Key, outcome any) error {
		*asked = append(*asked, key.String()+" "+outcome.(notified).MessageID)
		return *verdict
	}
	return def
}

func newDecider(t *testing.T, defs ...step.Definition) (*pipeline.Decider, *effects.Client) {
	t.Helper()
	c := effectstest.NewClient(t, dbtest.NewPool(t), &effects.ClientOpts{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	d, err := pipeline.NewDecider(c, defs...)
	require.NoError(t, err)
	return d, c
}

// ApplyDecision settles the decided record with effects.Resolve once the
// step's Verify confirms the outcome, keeps who decided, why and how it was
// checked, is idempotent, and refuses what cannot be resolved.
func TestApplyDecisionResolvesTheRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var verdict error
	var asked []string
	d, c := newDecider(t, notifyDef(&verdict, &asked))
	_, err := pipeline.NewDecider(nil)
	require.Error(t, err)
	_, err = pipeline.NewDecider(c, notifyDef(&verdict, &asked), notifyDef(&verdict, &asked))
	require.ErrorContains(t, err, `both declare step "notify"`)

	done := effects.MustKey("acme", "shipment", "s1", "notify")
	ambiguousRecord(t, c, done)
	in := pipeline.DecisionInput{EffectKey: done.String(), Step: "notify", Resolution: effects.ResolveDone,
		Result: json.RawMessage(`{"message_id":"msg_1"}`), Reason: "found at the provider", By: "ada",
		WorkflowID: "shipment:acme:s1", RunID: "run-1"}
	res, err := d.ApplyDecision(ctx, in)
	require.NoError(t, err)
	require.Equal(t, string(effects.StateSucceeded), res.State)
	require.Equal(t, "confirmed", res.Verification)
	require.Positive(t, res.Generation)
	require.Equal(t, []string{done.String() + " msg_1"}, asked, "the step's Verify got the decoded outcome")
	rec, err := c.Get(ctx, done)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.JSONEq(t, `{"message_id":"msg_1"}`, string(rec.Result))
	require.Contains(t, rec.ErrorMessage, "ada decided done via the decide update of run run-1: found at the provider (confirmed)")
	again, err := d.ApplyDecision(ctx, in)
	require.NoError(t, err, "applying the same decision twice leaves the record as once")
	require.Equal(t, res.Generation, again.Generation)

	// A retry of a record that succeeded is refused for good.
	in.Resolution, in.Result = effects.ResolveRetry, nil
	_, err = d.ApplyDecision(ctx, in)
	var app *temporal.ApplicationError
	require.ErrorAs(t, err, &app)
	require.Equal(t, step.ErrTypeInvalidState, app.Type())
	require.True(t, app.NonRetryable())

	// A retry of an effect never claimed has nothing to settle.
	never := effects.MustKey("acme", "shipment", "s2", "notify")
	res, err = d.ApplyDecision(ctx, pipeline.DecisionInput{EffectKey: never.String(), Step: "notify",
		Resolution: effects.ResolveRetry, Reason: "not at the provider", By: "ada"})
	require.NoError(t, err)
	require.Equal(t, "absent", res.State)
}

// A "done" is applied only when the step's Verify confirms it: a record
// that contradicts it is refused for good, one that cannot be read is
// refused unless the decision says unverified, which the record keeps. A
// step with no Verify cannot be confirmed. Nothing refused changes the
// record.
func TestApplyDecisionVerifiesDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var verdict error
	var asked []string
	d, c := newDecider(t, notifyDef(&verdict, &asked))
	bare, err := pipeline.NewDecider(c)
	require.NoError(t, err)
	key := effects.MustKey("acme", "shipment", "v1", "notify")
	ambiguousRecord(t, c, key)
	in := pipeline.DecisionInput{EffectKey: key.String(), Step: "notify", Resolution: effects.ResolveDone,
		Result: json.RawMessage(`{"message_id":"msg_1"}`), Reason: "seen", By: "ada", RunID: "run-1"}

	cases := []struct {
		name         string
		decider      *pipeline.Decider
		verdict      error
		edit         func(*pipeline.DecisionInput)
		want         string
		unverifiable bool
	}{
		{"contradicted", d, step.Contradicted("the provider has no message msg_1"), nil, "the provider has no message msg_1", false},
		{"contradicted, even unverified", d, step.Contradicted("other key"),
			func(in *pipeline.DecisionInput) { in.Unverified = true }, "other key", false},
		{"unavailable", d, step.Unverifiable("look-up: status 403"), nil, "the record could not be checked: look-up: status 403", true},
		{"unclassified", d, errors.New("boom"), nil, "the record could not be checked: boom", true},
		{"no verify", bare, nil, nil, `no check of step "notify" against its provider is registered`, true},
		{"malformed", d, nil, func(in *pipeline.DecisionInput) { in.Result = json.RawMessage(`{"id":"msg_1"}`) },
			`result has the unknown field "id"`, false},
		{"no result", d, nil, func(in *pipeline.DecisionInput) { in.Result = nil }, "result is required with done", false},
	}
	for _, tc := range cases {
		verdict = tc.verdict
		di := in
		if tc.edit != nil {
			tc.edit(&di)
		}
		_, err := tc.decider.Apply(ctx, di)
		var refused *pipeline.RefusedError
		require.ErrorAs(t, err, &refused, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
		require.Equal(t, tc.unverifiable, refused.Unverifiable, tc.name)
		if tc.unverifiable {
			require.ErrorContains(t, err, `"unverified": true`, tc.name)
		}
		_, err = tc.decider.ApplyDecision(ctx, di)
		var app *temporal.ApplicationError
		require.ErrorAs(t, err, &app, tc.name)
		require.Equal(t, pipeline.ErrTypeDecisionRefused, app.Type(), tc.name)
		require.True(t, app.NonRetryable(), tc.name)
		rec, err := c.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, effects.StateFailedTerminal, rec.State, "%s: refused, nothing changed", tc.name)
	}

	// The operator overrides a look-up that failed: applied, and the record
	// says it was not verified and why.
	verdict = step.Unverifiable("look-up: status 503")
	in.Unverified = true
	res, err := d.Apply(ctx, in)
	require.NoError(t, err)
	require.Equal(t, "unverified: look-up: status 503", res.Verification)
	rec, err := c.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.Contains(t, rec.ErrorMessage, "ada decided done via the decide update of run run-1: seen (unverified: look-up: status 503)")
}

// A "done" is refused for an effect never claimed and for one whose step
// refused for good (an invalid state): it did not happen.
func TestApplyDecisionRefusesDoneOnARefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var verdict error
	var asked []string
	d, c := newDecider(t, notifyDef(&verdict, &asked))
	key := effects.MustKey("acme", "shipment", "r1", "notify")
	cl, err := c.Claim(ctx, effects.ClaimParams{Key: key, Owner: "shipment:acme:r1/notify"})
	require.NoError(t, err)
	require.NoError(t, c.Fail(ctx, cl, &step.Error{Type: step.ErrTypeInvalidState, Message: "shipment is cancelled"}))
	in := pipeline.DecisionInput{EffectKey: key.String(), Step: "notify", Resolution: effects.ResolveDone,
		Result: json.RawMessage(`{"message_id":"msg_1"}`), Reason: "seen", By: "ada", Unverified: true}
	_, err = d.Apply(ctx, in)
	require.ErrorContains(t, err, "the step refused for good (invalid_state: shipment is cancelled)")
	in.EffectKey = effects.MustKey("acme", "shipment", "r2", "notify").String()
	_, err = d.Apply(ctx, in)
	require.ErrorContains(t, err, "there is no effect record under this key")
	require.Empty(t, asked, "nothing to ask the provider")
}
