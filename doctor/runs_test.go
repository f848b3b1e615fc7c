package doctor_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/slotshare"
)

// Modes of the stand-in order workflow.
const (
	modeFail      = "fail"      // fails at once
	modeWait      = "wait"      // waits for a decision, KeyedAttention set
	modeUnguarded = "unguarded" // Charge fails its first attempt, claiming nothing
	modeGuarded   = "guarded"   // Charge claims its key; the first attempt fails transiently
	modeRefused   = "refused"   // the worker refuses Charge's first attempt over its tenant's share
)

// standIn is an order workflow reduced to what a check looks at, registered
// under the order workflow's name.
func standIn(ctx workflow.Context, mode, key string) error {
	switch mode {
	case modeFail:
		return temporal.NewNonRetryableApplicationError("boom", "Boom", nil)
	case modeWait:
		if err := workflow.UpsertTypedSearchAttributes(ctx, pipeline.SearchAttrAttention.ValueSet("receipt:ambiguous")); err != nil {
			return err
		}
		return workflow.Await(ctx, func() bool { return false })
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond, MaximumAttempts: 3}})
	return workflow.ExecuteActivity(ctx, "Charge", mode, key).Get(ctx, nil)
}

type charger struct{ claims *effects.Client }

// Charge fails its first attempt; guarded, it claims key first, as a keyed
// activity does, and records the failure as transient.
func (c *charger) Charge(ctx context.Context, mode, key string) error {
	attempt := activity.GetInfo(ctx).Attempt
	if mode == modeRefused && attempt == 1 { // as slotshare refuses one, before the activity runs
		return temporal.NewApplicationErrorWithOptions("over share", slotshare.ErrorType,
			temporal.ApplicationErrorOptions{NextRetryDelay: 100 * time.Millisecond, Category: temporal.ApplicationErrorCategoryBenign})
	}
	if mode != modeGuarded {
		if attempt == 1 {
			return errors.New("blip")
		}
		return nil
	}
	k, err := effects.ParseKey(key)
	if err != nil {
		return err
	}
	cl, err := c.claims.Claim(ctx, effects.ClaimParams{Key: k, Owner: activity.GetInfo(ctx).WorkflowExecution.ID + "/charge"})
	if err != nil || cl.Done {
		return err
	}
	if attempt == 1 {
		cause := effects.Transient(errors.New("blip"))
		return errors.Join(cause, c.claims.Fail(ctx, cl, cause))
	}
	return c.claims.Complete(ctx, cl, map[string]string{"payment_intent_id": "pi_1"})
}

// work runs a worker of the stand-in on d's namespace until the test ends.
func (d *deployment) work(t *testing.T, claims *effects.Client) {
	t.Helper()
	w := worker.New(d.client, "doctor", worker.Options{})
	w.RegisterWorkflowWithOptions(standIn, workflow.RegisterOptions{Name: orders.WorkflowName})
	w.RegisterActivity(&charger{claims: claims})
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
}

// start starts the stand-in for the order and, unless it waits, waits for
// it to end.
func (d *deployment) start(t *testing.T, order, mode string) {
	t.Helper()
	run, err := d.client.ExecuteWorkflow(d.ctx, client.StartWorkflowOptions{ID: orders.WorkflowID("acme", order), TaskQueue: "doctor",
		TypedSearchAttributes: temporal.NewSearchAttributes(pipeline.SearchAttrTenantID.ValueSet("acme"), temporal.NewSearchAttributeKeyKeyword(orders.SearchAttrOrderID).ValueSet(order))},
		orders.WorkflowName, mode, "acme:order:"+order+":charge")
	require.NoError(t, err)
	if mode != modeWait {
		_ = run.Get(d.ctx, nil) // Failed or not, it ended.
	}
}

func TestDeadLettersAreRunsWaitingOrFailedWithTheirOrderNotFinal(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, allAttributes)
	d.work(t, nil)
	// A declined order: its run failed, and the order is final.
	_, err := d.pool.Exec(d.ctx, `INSERT INTO orders (tenant_id, id, amount_minor, currency, customer_email, payment_method, status)
VALUES ('acme', 'declined', 100, 'usd', 'ann@example.com', 'pm_card_chargeDeclined', 'failed')`)
	require.NoError(t, err)
	d.start(t, "declined", modeFail)
	var c doctor.Check
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		c = one(t, d.run(t, nil, doctor.CheckDeadLetters), doctor.CheckDeadLetters, "runs")
		assert.Contains(ct, c.Evidence, "1 failed run in the last 7d ended final")
	}, 20*time.Second, 250*time.Millisecond)
	require.Equal(t, doctor.StatusPass, c.Status, c.Evidence)

	d.start(t, "stuck", modeFail)
	d.start(t, "ambiguous", modeWait)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		c = one(t, d.run(t, nil, doctor.CheckDeadLetters), doctor.CheckDeadLetters, "runs")
		assert.Equal(ct, doctor.StatusWarn, c.Status, c.Evidence)
		assert.Contains(ct, c.Evidence, "1 run waits for a decision, the oldest started 0s ago (order:acme:ambiguous:fulfil, receipt:ambiguous)")
		assert.Contains(ct, c.Evidence, "1 run failed in the last 7d, not final, the oldest 0s ago (order:acme:stuck:fulfil)")
	}, 20*time.Second, 250*time.Millisecond)
	require.Contains(t, c.Fix, "starter resolve")
	require.Contains(t, c.Fix, "starter start --tenant … --order …")
}

func TestRetriesTheGuardNeverSawWarn(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, allAttributes)
	d.work(t, nil)
	d.start(t, "1", modeUnguarded)
	var c doctor.Check
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		c = one(t, d.run(t, nil, doctor.CheckSuppression), doctor.CheckSuppression, "Charge")
		assert.Equal(ct, doctor.StatusWarn, c.Status, c.Evidence)
	}, 20*time.Second, 250*time.Millisecond)
	require.Equal(t, "Temporal retried Charge 1 time in 1 recent run, yet the guard saw none of it: 0 charge records claimed again (last 7d); "+
		"suppressed duplicates not read (no metrics given: pass --metrics-url); the activity may act without claiming its effect key", c.Evidence)
	require.Contains(t, c.Fix, "make Charge claim {tenant}:order:{order}:charge through effects.Do or Claim")
	require.Equal(t, doctor.StatusPass, one(t, d.run(t, nil, doctor.CheckSuppression), doctor.CheckSuppression, "SendReceipt").Status)
}

// An attempt after one the worker refused over its tenant's share is not a
// retry the guard must see: the refused attempt never ran the activity.
func TestRetriesAfterAShareRefusalPass(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, allAttributes)
	d.work(t, nil)
	d.start(t, "1", modeRefused)
	var c doctor.Check
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		c = one(t, d.run(t, nil, doctor.CheckSuppression), doctor.CheckSuppression, "Charge")
		assert.Contains(ct, c.Evidence, "in 1 recent run")
	}, 20*time.Second, 250*time.Millisecond)
	require.Equal(t, doctor.StatusPass, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "Temporal retried no Charge attempt in 1 recent run")
}

func TestRetriesTheGuardSawPass(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, allAttributes)
	reg := prometheus.NewRegistry()
	m, err := effects.NewMetrics(reg)
	require.NoError(t, err)
	claims, err := effects.NewClient(d.pool, &effects.ClientOpts{Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	d.work(t, claims)
	d.start(t, "1", modeGuarded)
	// A second claim of the finished key is a suppressed duplicate.
	k, err := effects.ParseKey("acme:order:1:charge")
	require.NoError(t, err)
	cl, err := claims.Claim(d.ctx, effects.ClaimParams{Key: k, Owner: "order:acme:1:fulfil/charge"})
	require.NoError(t, err)
	require.True(t, cl.Done)

	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(metrics.Close)
	var c doctor.Check
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		c = one(t, d.run(t, func(o *doctor.Opts) { o.MetricsURL = metrics.URL }, doctor.CheckSuppression), doctor.CheckSuppression, "Charge")
		assert.Contains(ct, c.Evidence, "Temporal retried Charge 1 time in 1 recent run")
	}, 20*time.Second, 250*time.Millisecond)
	require.Equal(t, doctor.StatusPass, c.Status, c.Evidence)
	require.Equal(t, "Temporal retried Charge 1 time in 1 recent run; the guard saw them: 1 charge record claimed again (last 7d); "+
		"suppressed 1 duplicate ("+metrics.URL+" since that worker started)", c.Evidence)

	c = one(t, d.run(t, func(o *doctor.Opts) { o.Gatherer = reg }, doctor.CheckSuppression), doctor.CheckSuppression, "Charge")
	require.Contains(t, c.Evidence, "suppressed 1 duplicate (this worker's counter since it started)")
	unread := d.run(t, func(o *doctor.Opts) { o.MetricsURL = "http://127.0.0.1:1/metrics" }, doctor.CheckSuppression)
	c = one(t, unread, doctor.CheckSuppression, "Charge")
	require.Contains(t, c.Evidence, `suppressed duplicates not read: Get "http://127.0.0.1:1/metrics"`)
	c = one(t, unread, doctor.CheckSuppression, "metrics")
	require.Equal(t, doctor.StatusError, c.Status, "metrics asked for and not read are no pass")
	require.Contains(t, c.Fix, "--metrics-url")
}
