package fxapp_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/pipeline/pipelinetest"
)

// A third pipeline added to the registry runs end to end in the real
// worker: the relay starts its run from an outbox row with its Configure,
// the worker runs its step, the retention check counts its retry window,
// and doctor judges its declarations and search attributes.
func TestAThirdPipelineRunsInTheWorker(t *testing.T) {
	t.Parallel()
	var specs []pipeline.Spec
	w := fxapptest.Start(t, &fxapptest.Opts{Extra: []fx.Option{
		fx.Decorate(func(s []pipeline.Spec) []pipeline.Spec { return append(s, pipelinetest.Renewal()) }),
		fx.Populate(&specs),
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	payload, err := json.Marshal(pipelinetest.RenewalInput{Tenant: "acme", ID: "s1"})
	require.NoError(t, err)
	tx, err := w.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = outbox.EnqueueTx(ctx, tx, outbox.Request{WorkflowType: "RenewalWorkflow", WorkflowID: "renewal:acme:s1",
		Payload: payload, TenantID: "acme"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	var out string
	require.Eventually(t, func() bool {
		return w.Client.GetWorkflow(ctx, "renewal:acme:s1", "").Get(ctx, &out) == nil
	}, time.Minute, 100*time.Millisecond, "the relay starts the renewal and the worker runs it")
	require.Equal(t, "renewed", out)
	rec, err := w.Effects.Get(ctx, effects.MustKey("acme", "subscription", "s1", "renew"))
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)

	require.Equal(t, 10*time.Hour, pipeline.LongestRun(specs), "the retention check counts its retry window")

	rep, err := doctor.Run(ctx, doctor.Deps{Pool: w.Pool, Temporal: w.Client},
		&doctor.Opts{Namespace: w.Config.Temporal.Namespace, Pipelines: specs, Checks: []string{doctor.CheckSearchAttributes, doctor.CheckDeadLetters}})
	require.NoError(t, err)
	sa := rep.Find(doctor.CheckSearchAttributes, "")
	require.NotEmpty(t, sa)
	var evidence string
	for _, c := range sa {
		evidence += c.Evidence + c.Fix
	}
	require.Contains(t, evidence, "SubscriptionID", "doctor asks for the third pipeline's search attribute")
}
