package order_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/step"
)

var keyReused = temporal.NewNonRetryableApplicationError("the key came back with other inputs", step.ErrTypeKeyReused, nil)

// declaredSteps returns every declared step of both pipelines, as their
// workers register them, with the input that keys it.
func declaredSteps() []struct {
	in  pipeline.Keyer
	def step.Definition
} {
	var out []struct {
		in  pipeline.Keyer
		def step.Definition
	}
	var acts *ordersteps.Activities
	var racts *refundsteps.Activities
	for _, def := range acts.Definitions() {
		out = append(out, struct {
			in  pipeline.Keyer
			def step.Definition
		}{in, def})
	}
	refund := refunds.NewInput("acme", "9f3a", "r1", 500, "")
	for _, def := range racts.Definitions() {
		out = append(out, struct {
			in  pipeline.Keyer
			def step.Definition
		}{refund, def})
	}
	return out
}

// TestDoneWithoutTheOutcomeIsRefusedOnEveryDeclaredStep: on every declared
// step of both pipelines, waiting on a reused key, the decide update's
// validator refuses "done" without a result, with null, with an empty
// object, with a field the outcome does not have and with a value of
// another JSON type, before it enters history: ApplyDecision never runs.
func TestDoneWithoutTheOutcomeIsRefusedOnEveryDeclaredStep(t *testing.T) {
	t.Parallel()
	steps := declaredSteps()
	require.Len(t, steps, len(ordersteps.Declarations())+len(refundsteps.Declarations()))
	for _, s := range steps {
		t.Run(s.def.Step, func(t *testing.T) {
			t.Parallel()
			require.NotNil(t, s.def.Outcome, "%s declares the rule for a done outcome", s.def.Name)
			env := pipelinetest.NewEnv(t)
			env.RegisterWorkflowWithOptions(func(ctx workflow.Context) error {
				r, err := pipeline.New(ctx, s.in, []step.Declaration{s.def.Declaration}, nil)
				if err != nil {
					return err
				}
				var out json.RawMessage
				return r.Step(ctx, 0, s.def.Declaration, &out)
			}, workflow.RegisterOptions{Name: "OneStep"})
			var d *pipeline.Decider
			require.NoError(t, step.Register(env, s.def, d.Definition()))
			zero := reflect.Zero(reflect.TypeOf(s.def.Fn).Out(0)).Interface()
			env.OnActivity(s.def.Name, mock.Anything, mock.Anything).Return(zero, keyReused).Once()
			attention := pipelinetest.RecordAttention(env)
			started := pipelinetest.RecordStarted(env)

			bad := map[string]string{
				"no result":     "",
				"null":          "null",
				"empty object":  "{}",
				"unknown field": `{"not_a_field":"x"}`,
				"a string":      `"done"`,
				"an array":      `["pi_1"]`,
			}
			updates := map[string]*pipelinetest.Update{}
			for name, result := range bad {
				updates[name] = pipelinetest.Decide(env, pipeline.Decision{Step: s.def.Step, Resolution: effects.ResolveDone,
					By: "ada", Reason: "looked", Result: json.RawMessage(result)}, time.Hour)
			}
			env.ExecuteWorkflow("OneStep")

			for name, u := range updates {
				require.False(t, u.Accepted, name)
				require.ErrorContains(t, u.Rejected, "decision refused: result ", name)
			}
			require.ErrorContains(t, updates["no result"].Rejected, "result is required with done: the step's outcome, "+s.def.Outcome.Shape())
			require.ErrorContains(t, updates["unknown field"].Rejected, `result has the unknown field "not_a_field"`)
			require.Equal(t, []string{s.def.Step + ":key_reused", pipelinetest.Unset}, attention.Values())
			require.NotContains(t, started.Names(), pipeline.NameApplyDecision, "nothing refused entered history")
			var app *temporal.ApplicationError
			require.ErrorAs(t, env.GetWorkflowError(), &app)
			require.Equal(t, pipeline.ErrTypeDecisionTimeout, app.Type(), "the run waited on")
		})
	}
}

// The case on the order workflow itself: a charge waiting on a
// reused key is not decided done without a result, with a charge ID, or
// with a PaymentIntent that is not succeeded; every problem is named at
// once. A PaymentIntent ID with the outcome is accepted and applied, and
// the run goes on.
func TestChargeDoneNeedsAPaymentIntent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(orders.ChargeResult{}, keyReused).Once()
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(charged, nil).Once()
	b.env.OnActivity(ordersteps.NameMarkPaid, mock.Anything, in).Return(paid, nil).Once()
	b.env.OnActivity(ordersteps.NameSendReceipt, mock.Anything, in).Return(sent, nil).Once()
	applied := pipelinetest.MockApplyDecision(b.env, 2)
	b.expectAttention(t, "charge:key_reused")

	decide := func(result string, after time.Duration) *pipelinetest.Update {
		return pipelinetest.Decide(b.env, pipeline.Decision{Step: "charge", Resolution: effects.ResolveDone, By: "ops",
			Reason: "test", Result: json.RawMessage(result)}, after)
	}
	none := decide("", time.Hour)
	chargeID := decide(`{"payment_intent_id":"ch_1","status":"succeeded","amount_minor":1250,"currency":"eur"}`, time.Hour)
	pending := decide(`{"payment_intent_id":"pi_123","status":"requires_action","amount_minor":1250,"currency":"eur"}`, time.Hour)
	all := pipelinetest.Decide(b.env, pipeline.Decision{Step: "charge", Resolution: effects.ResolveDone,
		Reason: strings.Repeat("x", pipeline.MaxDecisionReason+1)}, time.Hour)
	good := decide(`{"payment_intent_id":"pi_123","status":"succeeded","amount_minor":1250,"currency":"eur"}`, 2*time.Hour)
	b.execute(in)

	require.ErrorContains(t, none.Rejected, `result is required with done: the step's outcome, {"payment_intent_id":"…","status":"…","amount_minor":0,"currency":"…"}`)
	require.ErrorContains(t, chargeID.Rejected, `payment_intent_id "ch_1" is not a Stripe PaymentIntent ID`)
	require.ErrorContains(t, pending.Rejected, `status "requires_action" is not "succeeded"`)
	require.EqualError(t, all.Rejected, "decision refused: reason is too long: 201 bytes, at most 200; by (who decides) is required; "+
		`result is required with done: the step's outcome, {"payment_intent_id":"…","status":"…","amount_minor":0,"currency":"…"}`)
	require.NoError(t, good.Err())
	require.NoError(t, b.env.GetWorkflowError())
	require.JSONEq(t, `{"payment_intent_id":"pi_123","status":"succeeded","amount_minor":1250,"currency":"eur"}`, string(applied.Result))
	pipelinetest.RequireSteps(t, []string{"Charge", "ApplyDecision", "Charge", "MarkPaid", "SendReceipt"}, b.started.Names())
}

// A refused ApplyDecision (the provider contradicts the outcome) fails the
// update with its type and message only, and the run keeps waiting for
// another decision.
func TestRefusedDoneFailsTheUpdateWithWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(orders.ChargeResult{}, keyReused).Once()
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(pipeline.DecisionResult{},
		temporal.NewNonRetryableApplicationError("DecisionRefused: done on charge acme:order:9f3a:charge refused: Stripe has no PaymentIntent pi_9",
			pipeline.ErrTypeDecisionRefused, nil)).Once()
	b.env.OnActivity(pipeline.NameApplyDecision, mock.Anything, mock.Anything).Return(pipeline.DecisionResult{State: "failed_transient"}, nil).Once()
	b.env.OnActivity(ordersteps.NameCharge, mock.Anything, in).Return(charged, nil).Once()
	b.env.OnActivity(ordersteps.NameMarkPaid, mock.Anything, in).Return(paid, nil).Once()
	b.env.OnActivity(ordersteps.NameSendReceipt, mock.Anything, in).Return(sent, nil).Once()
	b.expectAttention(t, "charge:key_reused")

	fake := pipelinetest.Decide(b.env, pipeline.Decision{Step: "charge", Resolution: effects.ResolveDone, By: "ops", Reason: "test",
		Result: json.RawMessage(`{"payment_intent_id":"pi_9","status":"succeeded","amount_minor":1250,"currency":"eur"}`)}, time.Hour)
	retry := pipelinetest.Decide(b.env, pipeline.Decision{Step: "charge", Resolution: effects.ResolveRetry, By: "ops", Reason: "not charged"}, 2*time.Hour)
	b.execute(in)

	require.True(t, fake.Accepted)
	var app *temporal.ApplicationError
	require.ErrorAs(t, fake.Completed, &app)
	require.Equal(t, pipeline.ErrTypeDecisionRefused, app.Type())
	require.Equal(t, "DecisionRefused: done on charge acme:order:9f3a:charge refused: Stripe has no PaymentIntent pi_9", app.Message())
	require.NoError(t, retry.Err())
	require.NoError(t, b.env.GetWorkflowError())
}
