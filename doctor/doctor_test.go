package doctor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"

	refundsteps "github.com/keyedhq/keyed/activities/refund"
	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/migrations"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
	"github.com/keyedhq/keyed/workflows"
)

// healthy fills d's schema with what a healthy deployment has: recent
// claims of every step with the declared key shapes, finished in a second,
// and a reconciliation an hour ago.
func (d *deployment) healthy(t *testing.T) {
	t.Helper()
	at := time.Now().Add(-time.Hour)
	for i, step := range []string{"charge", "mark_paid", "receipt", "mark_failed"} {
		d.record(t, "acme:order:h"+string(rune('0'+i))+":"+step, at, time.Second, 1)
	}
	for _, step := range []string{refunds.StepReserve, refunds.StepStripe, refunds.StepMark, refunds.StepEmail} {
		d.record(t, "acme:order:h0:refund:r1:"+step, at, time.Second, 1)
	}
	d.reconciled(t, time.Now().Add(-time.Hour), 0)
}

// reconciled records a successful reconciliation finished at with findings.
func (d *deployment) reconciled(t *testing.T, at time.Time, findings int) {
	t.Helper()
	_, err := d.pool.Exec(d.ctx, `INSERT INTO keyed_reconcile_runs
(window_from, window_to, records, payment_intents, in_flight, findings, finished_at) VALUES ($1, $2, 3, 3, 0, $3, $2)`,
		at.Add(-25*time.Hour), at, findings)
	require.NoError(t, err)
}

func TestHealthyDeploymentPassesEveryCheck(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, allAttributes)
	d.healthy(t)
	rep := d.run(t, nil)
	var text strings.Builder
	require.NoError(t, rep.WriteText(&text))
	for _, c := range rep.Checks {
		require.Equal(t, doctor.StatusPass, c.Status, "%s %s: %s\n%s", c.Name, c.Subject, c.Evidence, text.String())
	}
	for _, name := range doctor.AllChecks {
		require.NotEmpty(t, rep.Find(name, ""), "check %s ran", name)
	}
	require.Equal(t, doctor.ExitPass, rep.ExitCode())
	require.Contains(t, text.String(), "exit 0")
	require.Contains(t, one(t, rep, doctor.CheckClassified, "Charge").Evidence,
		"class external_create, step charge; 1 sampled claim (last 7d) all of the shape {tenant}:order:{order}:charge")
	require.Contains(t, one(t, rep, doctor.CheckClassified, "MarkPaid").Evidence,
		"class absolute_write, step mark_paid; self-guarded: claims no effect record, its own write under keys of the shape {tenant}:order:{order}:mark_paid is its record")
	require.Contains(t, one(t, rep, doctor.CheckDeadLetters, "runs").Evidence, "replay path: list them with `starter attention`")
	require.Contains(t, one(t, rep, doctor.CheckClassified, refundsteps.NameRefundAtStripe).Evidence,
		"class external_create, step refund_stripe; 1 sampled claim (last 7d) all of the shape {tenant}:order:{order}:refund:{refund_id}:refund_stripe")
}

// The worker registers both pipelines in one step.Register call, which
// refuses a name or step two activities share; doctor lists the same
// declarations, each with its pipeline's key shape and workflow.
func TestDeclaredListsBothPipelinesWithDistinctNamesAndSteps(t *testing.T) {
	t.Parallel()
	names, steps := map[string]bool{}, map[string]bool{}
	byName := map[string]doctor.Activity{}
	for _, a := range doctor.Declared(workflows.Pipelines()) {
		require.False(t, names[a.Name], "activity %s is declared twice", a.Name)
		require.False(t, steps[a.Step], "step %s is claimed twice", a.Step)
		names[a.Name], steps[a.Step], byName[a.Name] = true, true, a
	}
	require.Equal(t, "{tenant}:order:{order}:charge", byName["Charge"].KeyShape)
	require.Equal(t, orders.WorkflowName, byName["Charge"].Workflow)
	for _, name := range []string{refundsteps.NameReserve, refundsteps.NameRefundAtStripe, refundsteps.NameMarkRefunded, refundsteps.NameSendRefundEmail} {
		a, ok := byName[name]
		require.True(t, ok, "doctor lists %s", name)
		require.Equal(t, "{tenant}:order:{order}:refund:{refund_id}:"+a.Step, a.KeyShape)
		require.Equal(t, refunds.WorkflowName, a.Workflow)
		require.NotZero(t, a.Options.StartToCloseTimeout)
	}
}

func TestClassifiedFailsForARefundClaimedUnderAnOrderShapedKey(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, nil)
	at := time.Now().Add(-time.Minute)
	d.record(t, "acme:order:9f3a:refund:r1:refund_reserve", at, time.Second, 1)
	d.record(t, "acme:order:9f3a:refund_reserve", at, time.Second, 1)
	c := one(t, d.run(t, nil, doctor.CheckClassified), doctor.CheckClassified, refundsteps.NameReserve)
	require.Equal(t, doctor.StatusFail, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "1 of 2 sampled claims (last 7d) have keys not of the shape "+
		"{tenant}:order:{order}:refund:{refund_id}:refund_reserve, such as acme:order:9f3a:refund_reserve")
}

func TestClassifiedFailsForAnUndeclaredClassOrStepAndForAMisshapedKey(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, nil)
	d.healthy(t)
	extra := func(o *doctor.Opts) {
		o.Activities = append(doctor.Declared(workflows.Pipelines()),
			doctor.Activity{Name: "Refund", Step: "refund", KeyShape: "{tenant}:order:{order}:refund"},
			doctor.Activity{Name: "Ship", Class: effects.ClassExternalCreate, KeyShape: "{tenant}:order:{order}:ship"})
	}
	rep := d.run(t, extra, doctor.CheckClassified)
	c := one(t, rep, doctor.CheckClassified, "Refund")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Equal(t, `declares effect class "", which is not one of keyed's classes`, c.Evidence)
	require.Contains(t, c.Fix, "declare its Class")
	c = one(t, rep, doctor.CheckClassified, "Ship")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Equal(t, "declares no effect key step", c.Evidence)
	require.Equal(t, doctor.StatusPass, one(t, rep, doctor.CheckClassified, "Charge").Status)
	require.Equal(t, doctor.ExitFailures, rep.ExitCode())

	// A charge claimed under a key built from something else.
	d.recordKind(t, "acme:charge:attempt-2", "charge", time.Now().Add(-time.Minute), time.Second, 1)
	rep = d.run(t, nil, doctor.CheckClassified)
	c = one(t, rep, doctor.CheckClassified, "Charge")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Contains(t, c.Evidence, "1 of 2 sampled claims (last 7d) have keys not of the shape {tenant}:order:{order}:charge, such as acme:charge:attempt-2")
	require.Contains(t, c.Fix, "derive the key from the business event")
	require.Equal(t, doctor.StatusPass, one(t, rep, doctor.CheckClassified, "SendReceipt").Status)
	require.Equal(t, "class absolute_write, step decision; claims no key of its own", one(t, rep, doctor.CheckClassified, "ApplyDecision").Evidence)
}

func TestTimeoutBelowTheMeasuredP99Fails(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, nil)
	at := time.Now().Add(-time.Hour)
	for i := range 50 {
		id := string(rune('a'+i%26)) + string(rune('a'+i/26))
		d.record(t, "acme:order:"+id+":charge", at, 90*time.Second, 1)      // Charge: 60s start-to-close
		d.record(t, "acme:order:"+id+":mark_failed", at, 20*time.Second, 1) // MarkFailed: 30s
		d.record(t, "acme:order:"+id+":receipt", at, time.Second, 1)        // SendReceipt: 60s
		d.record(t, "acme:order:"+id+"x:mark_failed", at, 10*time.Hour, 3)  // retried: not one attempt's time
	}
	rep := d.run(t, nil, doctor.CheckTimeouts)
	c := one(t, rep, doctor.CheckTimeouts, "Charge")
	require.Equal(t, doctor.StatusFail, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "start-to-close 1m is 0.7× the p99 claim-to-finish time 1m30s of 50 single-attempt charge claims (last 7d)")
	require.Contains(t, c.Fix, "raise Charge's StartToCloseTimeout (workflows.ActivityOptions) to at least 3× the p99, 4m30s")
	c = one(t, rep, doctor.CheckTimeouts, "MarkFailed")
	require.Equal(t, doctor.StatusWarn, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "start-to-close 30s is 1.5× the p99 claim-to-finish time 20s of 50 single-attempt mark_failed claims")
	c = one(t, rep, doctor.CheckTimeouts, "SendReceipt")
	require.Equal(t, doctor.StatusPass, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "is 60× the p99 claim-to-finish time 1s")
	require.Empty(t, rep.Find(doctor.CheckTimeouts, "ApplyDecision"), "no records of its own")
	require.Empty(t, rep.Find(doctor.CheckTimeouts, "MarkPaid"), "self-guarded: no records of its own")
	require.Equal(t, doctor.ExitFailures, rep.ExitCode())
}

func TestLeaseAgainstItsRenewal(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, nil)
	rep := d.run(t, nil, doctor.CheckLease)
	c := one(t, rep, doctor.CheckLease, "Charge")
	require.Equal(t, doctor.StatusPass, c.Status)
	require.Equal(t, "claim lease 5m is 60× the 5s interval at which it is renewed (heartbeat timeout 15s)", c.Evidence)
	require.Equal(t, doctor.StatusPass, one(t, rep, doctor.CheckLease, "MarkFailed").Status)
	require.Empty(t, rep.Find(doctor.CheckLease, "MarkPaid"), "self-guarded: no claim, no lease")

	rep = d.run(t, func(o *doctor.Opts) { o.ClaimLease = 10 * time.Second }, doctor.CheckLease)
	require.Equal(t, doctor.StatusWarn, one(t, rep, doctor.CheckLease, "Charge").Status)
	c = one(t, rep, doctor.CheckLease, "MarkFailed")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Contains(t, c.Evidence, "claim lease 10s is shorter than the start-to-close timeout 30s")
	rep = d.run(t, func(o *doctor.Opts) { o.ClaimLease = 3 * time.Second }, doctor.CheckLease)
	c = one(t, rep, doctor.CheckLease, "SendReceipt")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Contains(t, c.Fix, "effects.ClientOpts.Lease")
}

func TestShortRetentionFails(t *testing.T) {
	t.Parallel()
	d := deploy(t, 30*24*time.Hour, nil)
	// What it takes, from the declarations: the namespace's 30 days, the
	// longest run's retry windows and the decision timeout, to the next
	// whole hour.
	least := (30*24*time.Hour + pipeline.LongestRun(workflows.Pipelines()) + config.DefaultDecisionTimeout).Round(time.Hour) + time.Hour
	// The default EFFECTS_RETENTION, 30 days, does not outlive a 30-day namespace retention.
	rep := d.run(t, nil, doctor.CheckRetention)
	c := one(t, rep, doctor.CheckRetention, "EFFECTS_RETENTION")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Contains(t, c.Evidence, "EFFECTS_RETENTION 720h0m0s is shorter than namespace \""+d.ns+"\"'s retention 720h0m0s")
	require.Contains(t, c.Evidence, fmt.Sprintf("set it to at least %s", least))
	require.Contains(t, c.Fix, "set EFFECTS_RETENTION on every worker")
	require.Equal(t, doctor.StatusPass, one(t, rep, doctor.CheckRetention, "Idempotency-Key").Status)
	require.Equal(t, doctor.StatusPass, one(t, rep, doctor.CheckRetention, "outbox").Status)

	rep = d.run(t, func(o *doctor.Opts) {
		o.EffectsRetention = least
		o.IdempotencyRetention = 12 * time.Hour
		o.OutboxRetention = 30 * time.Second
	}, doctor.CheckRetention)
	c = one(t, rep, doctor.CheckRetention, "EFFECTS_RETENTION")
	require.Equal(t, doctor.StatusPass, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, " covers namespace \""+d.ns+"\"'s retention 30d + the longest run ")
	require.Contains(t, c.Evidence, "(retry windows: Charge 30m,")
	c = one(t, rep, doctor.CheckRetention, "Idempotency-Key")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Contains(t, c.Evidence, "stored responses kept 12h, less than the published 24h")
	c = one(t, rep, doctor.CheckRetention, "outbox")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Contains(t, c.Evidence, "sent rows kept 30s, less than the relay's longest backoff 1m")

	rep = d.run(t, func(o *doctor.Opts) { o.CheckRetention = nil }, doctor.CheckRetention)
	require.Equal(t, doctor.StatusError, one(t, rep, doctor.CheckRetention, "EFFECTS_RETENTION").Status)
	require.Equal(t, doctor.ExitError, rep.ExitCode())
}

func TestMissingOrMistypedSearchAttributeFails(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, map[string]enumspb.IndexedValueType{
		"TenantID": enumspb.INDEXED_VALUE_TYPE_KEYWORD, "OrderID": enumspb.INDEXED_VALUE_TYPE_TEXT})
	rep := d.run(t, nil, doctor.CheckSearchAttributes, doctor.CheckDeadLetters)
	require.Equal(t, doctor.StatusPass, one(t, rep, doctor.CheckSearchAttributes, "TenantID").Status)
	c := one(t, rep, doctor.CheckSearchAttributes, "OrderID")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Equal(t, "registered on namespace \""+d.ns+"\" as Text, not Keyword", c.Evidence)
	c = one(t, rep, doctor.CheckSearchAttributes, "KeyedAttention")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Contains(t, c.Evidence, "not registered on namespace \""+d.ns+"\": a run that needs a decision cannot mark itself")
	require.Equal(t, "temporal operator search-attribute create --namespace "+d.ns+" --name KeyedAttention --type Keyword", c.Fix)
	// Without the attribute the dead letters cannot be listed.
	c = one(t, rep, doctor.CheckDeadLetters, "runs")
	require.Equal(t, doctor.StatusError, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "could not check: list attention")
	require.Equal(t, doctor.ExitFailures, rep.ExitCode(), "a failure outranks a check that could not be made")
}

func TestTinyPoolFailsAndASmallOneWarns(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, nil)
	worker := func(url string) func(*doctor.Opts) {
		cfg := &config.Config{Role: config.Worker, Database: config.Database{URL: url},
			Worker: config.WorkerTuning{MaxConcurrentActivities: config.DefaultMaxActivities}}
		return func(o *doctor.Opts) { o.Pool = fxapp.DoctorOpts(cfg, nil).Pool }
	}
	base := "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	least, def := fxapp.PoolNeeds(&config.Config{Role: config.Worker, Worker: config.WorkerTuning{MaxConcurrentActivities: config.DefaultMaxActivities}})
	rep := d.run(t, worker(base+"&pool_max_conns=2"), doctor.CheckPool)
	c := one(t, rep, doctor.CheckPool, "worker")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Contains(t, c.Evidence, fmt.Sprintf("pool_max_conns=2: the worker needs at least %d (the outbox listener, the relay and the prune hold or use one each, "+
		"the activities at least one) and by default takes %d for %d activity slots on %d cores; Postgres allows",
		least, def, config.DefaultMaxActivities, runtime.GOMAXPROCS(0)))
	require.Equal(t, fmt.Sprintf("raise pool_max_conns in DATABASE_URL to at least %d, or drop it to get %d", least, def), c.Fix)

	rep = d.run(t, worker(base+fmt.Sprintf("&pool_max_conns=%d", def-1)), doctor.CheckPool)
	c = one(t, rep, doctor.CheckPool, "worker")
	require.Equal(t, doctor.StatusWarn, c.Status)
	require.Contains(t, c.Evidence, "activities queue for connections under load")

	rep = d.run(t, worker(base), doctor.CheckPool)
	c = one(t, rep, doctor.CheckPool, "worker")
	require.Equal(t, doctor.StatusPass, c.Status, c.Evidence)
	require.True(t, strings.HasPrefix(c.Evidence, fmt.Sprintf("%d connections", def)), c.Evidence)
}

func TestReconcileMustHaveRunWithinItsPeriod(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, nil)
	// A new install: its first run is not due yet.
	rep := d.run(t, nil, doctor.CheckReconcile)
	c := one(t, rep, doctor.CheckReconcile, "deployment")
	require.Equal(t, doctor.StatusPass, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "no reconciliation recorded yet: keyed's tables were created ")
	require.Contains(t, c.Evidence, " ago, within the period 25h")

	// An install whose age cannot be read is not judged either way.
	_, err := d.pool.Exec(d.ctx, `ALTER TABLE keyed_schema_migrations RENAME TO keyed_schema_migrations_away`)
	require.NoError(t, err)
	c = one(t, d.run(t, nil, doctor.CheckReconcile), doctor.CheckReconcile, "deployment")
	require.Equal(t, doctor.StatusError, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "could not check: read when keyed's tables were created: ")
	_, err = d.pool.Exec(d.ctx, `ALTER TABLE keyed_schema_migrations_away RENAME TO keyed_schema_migrations`)
	require.NoError(t, err)

	// The same install a period later, still without a run.
	_, err = d.pool.Exec(d.ctx, `UPDATE keyed_schema_migrations SET applied_at = applied_at - interval '26 hours'`)
	require.NoError(t, err)
	rep = d.run(t, nil, doctor.CheckReconcile)
	c = one(t, rep, doctor.CheckReconcile, "deployment")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Equal(t, "no successful reconciliation with Stripe was ever recorded in keyed_reconcile_runs", c.Evidence)
	require.Contains(t, c.Fix, "starter reconcile --since 25h")

	d.reconciled(t, time.Now().Add(-49*time.Hour), 0)
	c = one(t, d.run(t, nil, doctor.CheckReconcile), doctor.CheckReconcile, "deployment")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Contains(t, c.Evidence, "last successful run 49h ago (period 25h)")

	d.reconciled(t, time.Now().Add(-2*time.Hour), 0)
	c = one(t, d.run(t, nil, doctor.CheckReconcile), doctor.CheckReconcile, "deployment")
	require.Equal(t, doctor.StatusPass, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "3 charge records, 3 payment intents, 0 findings")

	d.reconciled(t, time.Now().Add(-time.Hour), 2)
	c = one(t, d.run(t, nil, doctor.CheckReconcile), doctor.CheckReconcile, "deployment")
	require.Equal(t, doctor.StatusWarn, c.Status, c.Evidence)

	// A schema with the effects tables only: the app's migrations never ran.
	d.pool = effectstest.NewPool(t)
	rep = d.run(t, nil, doctor.CheckReconcile)
	c = one(t, rep, doctor.CheckReconcile, "deployment")
	require.Equal(t, doctor.StatusError, c.Status, c.Evidence)
	require.Contains(t, c.Evidence, "could not check: read the last reconciliation run: ERROR: relation \"keyed_reconcile_runs\" does not exist")
	require.Equal(t, "apply keyed's migrations (starter migrate, or start a worker)", c.Fix)
	require.Equal(t, doctor.ExitError, rep.ExitCode())
}

func TestDeadLetterAlertsInTheRulesFile(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, allAttributes)
	c := one(t, d.run(t, nil, doctor.CheckDeadLetters), doctor.CheckDeadLetters, "alerts")
	require.Equal(t, doctor.StatusPass, c.Status, c.Evidence)
	require.Equal(t, "../deploy/prometheus/keyed.rules.yml alerts on dead letters: KeyedRunsAwaitingDecision (keyed_attention_waits_total), "+
		"KeyedDecisionTimeouts (keyed_decision_timeouts_total)", c.Evidence)

	manifest := func(o *doctor.Opts) { o.RulesFile = "../deploy/k8s/base/prometheusrule.yaml" }
	require.Equal(t, doctor.StatusPass, one(t, d.run(t, manifest, doctor.CheckDeadLetters), doctor.CheckDeadLetters, "alerts").Status)

	partial := filepath.Join(t.TempDir(), "rules.yml")
	require.NoError(t, os.WriteFile(partial, []byte(`groups:
  - name: keyed
    rules:
      - alert: KeyedRunsAwaitingDecision
        expr: sum(increase(keyed_attention_waits_total[1h])) > 0
`), 0o600))
	c = one(t, d.run(t, func(o *doctor.Opts) { o.RulesFile = partial }, doctor.CheckDeadLetters), doctor.CheckDeadLetters, "alerts")
	require.Equal(t, doctor.StatusFail, c.Status)
	require.Equal(t, partial+" has no alert on keyed_decision_timeouts_total: dead letters would wait unseen", c.Evidence)
	require.Contains(t, c.Fix, "KeyedDecisionTimeouts")

	c = one(t, d.run(t, func(o *doctor.Opts) { o.RulesFile = "" }, doctor.CheckDeadLetters), doctor.CheckDeadLetters, "alerts")
	require.Equal(t, doctor.StatusWarn, c.Status)
	require.Contains(t, c.Fix, "pass --rules")
}

func TestExitCodeIsTheWorstStatusAndTheReportIsJSON(t *testing.T) {
	t.Parallel()
	rep := &doctor.Report{}
	require.Equal(t, doctor.ExitPass, rep.ExitCode())
	for _, c := range []struct {
		add  doctor.Status
		want int
	}{{doctor.StatusPass, 0}, {doctor.StatusWarn, 3}, {doctor.StatusError, 1}, {doctor.StatusFail, 4}, {doctor.StatusWarn, 4}} {
		rep.Checks = append(rep.Checks, doctor.Check{Name: "x", Subject: "y", Status: c.add})
		require.Equal(t, c.want, rep.ExitCode(), "after adding %s", c.add)
	}
	out, err := json.Marshal(doctor.Check{Name: "pool", Subject: "worker", Status: doctor.StatusFail, Evidence: "e", Fix: "f"})
	require.NoError(t, err)
	require.JSONEq(t, `{"check":"pool","subject":"worker","status":"fail","evidence":"e","fix":"f"}`, string(out))
	require.Equal(t, []float64{0, 1, 2, 3}, []float64{doctor.StatusPass.Value(), doctor.StatusWarn.Value(), doctor.StatusError.Value(), doctor.StatusFail.Value()})
}

// The provider_rate check shows each provider's bound: unbounded passes
// with a hint; a bound no worker polls warns; a bound a worker polls with
// passes, with the rate Temporal enforces on the queue.
func TestProviderRateShowsTheBoundTemporalEnforces(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, allAttributes)
	queue := "doctor-rate-" + d.ns
	rates := fxapp.ProviderRates(queue, config.Stripe{CallsPerSecond: 10}, config.SendGrid{})
	edit := func(o *doctor.Opts) { o.ProviderRates = rates }
	rep := d.run(t, edit, doctor.CheckProviderRate)
	stripe := one(t, rep, doctor.CheckProviderRate, "stripe")
	require.Equal(t, doctor.StatusWarn, stripe.Status, stripe.Evidence)
	require.Contains(t, stripe.Fix, "no worker polls "+queue+"-stripe")
	mail := one(t, rep, doctor.CheckProviderRate, "sendgrid")
	require.Equal(t, doctor.StatusPass, mail.Status)
	require.Contains(t, mail.Evidence, "SENDGRID_CALLS_PER_SECOND=0")

	w := worker.New(d.client, queue+"-stripe", worker.Options{DisableWorkflowWorker: true, TaskQueueActivitiesPerSecond: 10})
	w.RegisterActivityWithOptions(func(context.Context) error { return nil }, activity.RegisterOptions{Name: "noop"})
	require.NoError(t, w.Start())
	defer w.Stop()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		stripe := one(t, d.run(t, edit, doctor.CheckProviderRate), doctor.CheckProviderRate, "stripe")
		assert.Equal(c, doctor.StatusPass, stripe.Status, stripe.Evidence)
		assert.Contains(c, stripe.Evidence, "Temporal enforces 10/s there (source Worker)")
	}, 30*time.Second, 500*time.Millisecond)
}

// The partitions check warns of an expired leaf kept by a claim in flight
// and of a leaf an interrupted retirement detached and left, naming both.
func TestPartitionsWarnsOfLeavesKeptPastTheirLifetime(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, nil)
	c, err := effects.NewClient(d.pool, nil)
	require.NoError(t, err)
	require.NoError(t, c.SetLifetimes(d.ctx, []effects.Lifetime{{Kind: "", Keep: 2 * 24 * time.Hour}}, nil))
	_, err = c.EnsureLeaves(d.ctx, 10*24*time.Hour, 48*time.Hour)
	require.NoError(t, err)
	leafOf := func(key string) string {
		var leaf string
		require.NoError(t, d.pool.QueryRow(d.ctx, `SELECT tableoid::regclass::text FROM keyed_effects WHERE key = $1`, key).Scan(&leaf))
		return leaf
	}
	d.record(t, "acme:order:old:receipt", time.Now().Add(-8*24*time.Hour), time.Second, 1)
	left := leafOf("acme:order:old:receipt")
	_, err = d.pool.Exec(d.ctx, `ALTER TABLE keyed_effects_default DETACH PARTITION `+left)
	require.NoError(t, err)
	d.record(t, "acme:order:stuck:receipt", time.Now().Add(-6*24*time.Hour), time.Second, 1)
	_, err = d.pool.Exec(d.ctx, `UPDATE keyed_effects SET state = 'claimed', lease_until = now(), finished_at = NULL WHERE key = 'acme:order:stuck:receipt'`)
	require.NoError(t, err)
	stuck := leafOf("acme:order:stuck:receipt")

	rep := d.run(t, nil, doctor.CheckPartitions)
	var warned []string
	for _, ch := range rep.Find(doctor.CheckPartitions, "keyed_effects_default") {
		if ch.Status == doctor.StatusWarn {
			warned = append(warned, ch.Evidence)
		}
	}
	require.Len(t, warned, 2, "%+v", rep.Checks)
	require.Contains(t, strings.Join(warned, "\n"), stuck+" (1 claims in flight)")
	require.Contains(t, strings.Join(warned, "\n"), "detached by an interrupted retirement and not dropped: "+left)
}

// The partitions check warns of a class whose largest leaf is over the
// limit, naming the leaf and its size, and of no other.
func TestPartitionsWarnsOfALeafTooLargeToDrop(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, nil)
	c, err := effects.NewClient(d.pool, nil)
	require.NoError(t, err)
	lifetimes := []effects.Lifetime{{Kind: "", Keep: 2 * 24 * time.Hour}, {Kind: "charge", Keep: 4 * 24 * time.Hour}}
	require.NoError(t, c.SetLifetimes(d.ctx, lifetimes, nil))
	_, err = d.pool.Exec(d.ctx, `INSERT INTO keyed_effects (key, tenant_id, kind, class, state, owner, result, finished_at)
		SELECT 'acme:order:' || i || ':receipt', 'acme', 'receipt', 'default', 'succeeded', 'o', '{"id":"msg"}', now()
		FROM generate_series(1, 5000) i`)
	require.NoError(t, err)
	var leaf string
	require.NoError(t, d.pool.QueryRow(d.ctx, `SELECT tableoid::regclass::text FROM keyed_effects WHERE key = 'acme:order:1:receipt'`).Scan(&leaf))

	rep := d.run(t, func(o *doctor.Opts) { o.LeafLimit = 256 << 10 }, doctor.CheckPartitions)
	var warned []doctor.Check
	for _, ch := range rep.Checks {
		if ch.Status == doctor.StatusWarn {
			warned = append(warned, ch)
		}
	}
	require.Len(t, warned, 1, "%+v", rep.Checks)
	require.Equal(t, "keyed_effects_default", warned[0].Subject)
	require.Contains(t, warned[0].Evidence, "leaf "+leaf+" holds ")
	require.Contains(t, warned[0].Fix, "EFFECTS_LEAVES_PER_LIFETIME to ")

	rep = d.run(t, nil, doctor.CheckPartitions)
	for _, ch := range rep.Checks {
		require.Equal(t, doctor.StatusPass, ch.Status, "%+v", ch)
	}
}

// The partitions check warns when a read of every leaf would take more
// locks than max_locks_per_transaction, and says how many it needs.
func TestPartitionsWarnsOfLeavesBeyondTheLockTable(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, nil)
	c, err := effects.NewClient(d.pool, nil)
	require.NoError(t, err)
	day := 24 * time.Hour
	lifetimes := []effects.Lifetime{{Kind: "", Keep: 30 * day}, {Kind: "charge", Keep: 180 * day}}
	require.NoError(t, c.SetLifetimes(d.ctx, lifetimes, nil))
	for _, ch := range d.run(t, nil, doctor.CheckPartitions).Checks {
		require.Equal(t, doctor.StatusPass, ch.Status, "%+v", ch)
	}

	require.NoError(t, c.SetLifetimes(d.ctx, lifetimes, &effects.SetLifetimesOpts{LeavesPerLifetime: effects.MaxLeavesPerLifetime}))
	_, err = c.EnsureLeaves(d.ctx, 0, 180*day)
	require.NoError(t, err)
	leaves, err := c.Leaves(d.ctx)
	require.NoError(t, err)
	var most int
	require.NoError(t, d.pool.QueryRow(d.ctx, `SELECT current_setting('max_locks_per_transaction')::int`).Scan(&most))
	require.Greater(t, 3*len(leaves), most, "enough leaves for the test")

	warn := one(t, d.run(t, nil, doctor.CheckPartitions), doctor.CheckPartitions, "keyed_effects")
	require.Equal(t, doctor.StatusWarn, warn.Status, warn.Evidence)
	require.Contains(t, warn.Evidence, fmt.Sprintf("takes %d locks, over max_locks_per_transaction %d", 3*len(leaves)+3, most))
	require.Contains(t, warn.Fix, "set max_locks_per_transaction to at least")
}

// A schema behind the build (a release started with MIGRATE_ON_START=false
// before its migration job) fails the migrations check, naming what is
// missing and how to apply it.
func TestMigrationsCheckFailsOnASchemaBehindTheBuild(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, allAttributes)
	pass := one(t, d.run(t, nil, doctor.CheckMigrations), doctor.CheckMigrations, "schema")
	require.Equal(t, doctor.StatusPass, pass.Status, pass.Evidence)

	last := len(effects.Migrations())
	_, err := d.pool.Exec(d.ctx, `DELETE FROM keyed_effects_migrations WHERE version = $1`, last)
	require.NoError(t, err)
	rep := d.run(t, nil, doctor.CheckMigrations)
	fail := one(t, rep, doctor.CheckMigrations, "schema")
	require.Equal(t, doctor.StatusFail, fail.Status)
	require.Contains(t, fail.Evidence, fmt.Sprintf("effects [%d]", last))
	require.Contains(t, fail.Fix, "starter migrate")
	require.Equal(t, doctor.ExitFailures, rep.ExitCode())
}

// A schema ahead of the build (a newer build migrated it, as during a
// rolling deploy) warns, naming the versions, instead of passing.
func TestMigrationsCheckWarnsOnASchemaAheadOfTheBuild(t *testing.T) {
	t.Parallel()
	d := deploy(t, 24*time.Hour, allAttributes)
	all, err := migrations.All()
	require.NoError(t, err)
	next := all[len(all)-1].Version + 1
	_, err = d.pool.Exec(d.ctx, `INSERT INTO keyed_schema_migrations (version, name) VALUES ($1, 'from_a_newer_build.sql')`, next)
	require.NoError(t, err)

	rep := d.run(t, nil, doctor.CheckMigrations)
	warn := one(t, rep, doctor.CheckMigrations, "schema")
	require.Equal(t, doctor.StatusWarn, warn.Status, warn.Evidence)
	require.Contains(t, warn.Evidence, fmt.Sprintf("app [%d]", next))
	require.Contains(t, warn.Evidence, "a newer build migrated it")
	require.Contains(t, warn.Fix, "rolling deploy")
	require.Equal(t, doctor.ExitWarnings, rep.ExitCode())
}
