package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"go.temporal.io/sdk/client"

	orderacts "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/activities/stripestep"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/reconcile"
)

// starter runs the CLI in-process with env and returns its exit code,
// stdout and stderr.
func starter(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, args, &env{stdout: &stdout, stderr: &stderr, lookup: fxapptest.Lookup(vars), environ: fxapptest.Environ(vars)})
	return code, stdout.String(), stderr.String()
}

func TestHelpDocumentsEveryCommandAndFlag(t *testing.T) {
	t.Parallel()
	code, out, _ := starter(t, nil, "--help")
	require.Equal(t, 0, code)
	for _, c := range commands() {
		require.Contains(t, out, "  "+c.name+" ")
	}
	for _, v := range []string{"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_TASK_QUEUE"} {
		require.Contains(t, out, v)
	}
	want := map[string][]string{
		"create":    {"--tenant", "--order", "--amount", "--currency", "--email", "--payment-method", "--json", "--temporal-address", "--task-queue"},
		"start":     {"--tenant", "--order", "--json"},
		"show":      {"--tenant", "--order", "--json"},
		"reconcile": {"--since", "--until", "--json"},
	}
	for cmd, flags := range want {
		code, out, _ := starter(t, nil, cmd, "-h")
		require.Equal(t, 0, code, cmd)
		require.Contains(t, out, "Usage: starter "+cmd)
		for _, f := range flags {
			require.Regexp(t, `(?m)^  `+f+`( |$)`, out, "%s -h documents %s", cmd, f)
		}
		code, out2, _ := starter(t, nil, "help", cmd)
		require.Equal(t, 0, code)
		require.Equal(t, out, out2)
	}
	code, _, errOut := starter(t, nil, "frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown command "frobnicate"`)
	code, _, _ = starter(t, nil)
	require.Equal(t, 2, code)
}

func TestBadInputNamesTheFlagAndCreatesNothing(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	env := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
	good := []string{"--tenant", "acme", "--order", "o1", "--amount", "1999", "--currency", "usd",
		"--email", "ann@example.com", "--payment-method", "pm_card_visa"}
	with := func(flag, value string) []string {
		args := append([]string{"create"}, good...)
		for i := range args {
			if args[i] == flag {
				args[i+1] = value
			}
		}
		return args
	}
	cases := []struct {
		args []string
		want string
	}{
		{with("--amount", "-5"), "invalid --amount: -5 is not a positive amount"},
		{with("--amount", "0"), "invalid --amount"},
		{with("--currency", "xyz"), "invalid --currency"},
		{with("--email", "not-an-email"), "invalid --email"},
		{with("--email", "a@b"), "invalid --email"},
		{with("--email", "ann\u202e@example.com"), "invalid --email"},
		{with("--email", "ann@[127.0.0.1]"), "invalid --email"},
		{with("--email", "ann\ufe0f@example.com"), "invalid --email"},
		{with("--email", "ann\u034f@example.com"), "invalid --email"},
		{with("--email", "ann\u180b@example.com"), "invalid --email"},
		{with("--email", "ann\u3164@example.com"), "invalid --email"},
		{with("--email", "ann\uffa0@example.com"), "invalid --email"},
		{with("--email", "ann\u2800@example.com"), "invalid --email"},
		{with("--email", "\u0301@example.com"), "invalid --email"},
		{with("--currency", "DK\u212a"), "invalid --currency"}, // the Kelvin sign folds to k
		{with("--email", strings.Repeat("a", 250)+"@example.com"), "invalid --email"},
		{with("--payment-method", "card_123"), "invalid --payment-method"},
		{with("--tenant", "ac:me"), "invalid --tenant"},
		{with("--order", "a b"), "invalid --order"},
		{with("--amount", "ten"), `invalid value "ten" for flag --amount`},
		{[]string{"create", "--tenant", "acme"}, "missing --order, --amount, --currency, --email, --payment-method"},
		{[]string{"start"}, "missing --tenant, --order"},
		{[]string{"show", "--tenant", "acme"}, "missing --order"},
		{append(with("--tenant", "acme"), "extra"), "unexpected arguments: extra"},
	}
	for _, c := range cases {
		code, out, errOut := starter(t, env, c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, "%v", c.args)
		require.Empty(t, out)
	}
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n))
	require.Zero(t, n, "bad input creates nothing")

	code, _, errOut := starter(t, map[string]string{"TEMPORAL_ADDRESS": "nope", "DATABASE_URL": "postgres://u:sekrit@h:x/db"}, good...)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "TEMPORAL_ADDRESS")
	require.Contains(t, errOut, "DATABASE_URL")
	require.NotContains(t, errOut, "sekrit")

	// A pool smaller than the starter needs is bad configuration found on
	// start: exit 2 too, naming DATABASE_URL, and nothing is created.
	least, _ := fxapp.PoolNeeds(&config.Config{Role: config.Starter})
	small := map[string]string{"DATABASE_URL": url + "&pool_max_conns=" + strconv.Itoa(int(least)-1), "TEMPORAL_ADDRESS": "127.0.0.1:1"}
	for _, args := range [][]string{append([]string{"create"}, good...), {"show", "--tenant", "acme", "--order", "o1"}} {
		code, out, errOut := starter(t, small, args...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
		require.Contains(t, errOut, "DATABASE_URL", "%v", args)
		require.Empty(t, out)
	}
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n))
	require.Zero(t, n, "bad configuration creates nothing")
}

func TestCreateStartShowAgainstAWorker(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, nil)
	env := map[string]string{}
	for _, k := range []string{"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_TASK_QUEUE"} {
		env[k] = w.Env[k]
	}
	args := []string{"--tenant", "acme", "--order", "cli-1", "--amount", "2500", "--currency", "EUR",
		"--email", "bob@example.com", "--payment-method", "pm_card_visa"}

	code, out, errOut := starter(t, env, append([]string{"create"}, args...)...)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, errOut, "warning", "a worker polls the queue")
	require.Contains(t, out, "workflow ID  order:acme:cli-1:fulfil")
	require.Contains(t, out, "start        new")
	require.Contains(t, out, "(created)")
	require.Regexp(t, `run ID\s+\S+`, out)
	var queued int
	require.NoError(t, w.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM keyed_outbox WHERE workflow_id = $1`, orders.WorkflowID("acme", "cli-1")).Scan(&queued))
	require.Equal(t, 1, queued, "create writes the order and its outbox row together")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, w.Client.GetWorkflow(ctx, orders.WorkflowID("acme", "cli-1"), "").Get(ctx, nil))

	// The same create again finds the order and starts no second checkout.
	code, out, errOut = starter(t, env, append([]string{"create", "--json"}, args...)...)
	require.Equal(t, 0, code, errOut)
	var res startResult
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, "collapsed", res.Start)
	require.NotNil(t, res.OrderCreated)
	require.False(t, *res.OrderCreated)
	require.Equal(t, 1, w.Stripe.Charges())
	require.Len(t, w.SendGrid.Messages(), 1)

	// A mistyped queue: the run is started (its worker may come), with a
	// warning that names the queue; a start on the right queue joins it
	// and says it cannot move it. (The order has no outbox row, which the
	// worker's relay would start on its own queue first.)
	_, _, err := w.Orders.Create(ctx, orders.NewOrder{TenantID: "acme", ID: "cli-typo", AmountMinor: 2500, Currency: "eur",
		CustomerEmail: "ann@example.com", PaymentMethod: "pm_card_visa"})
	require.NoError(t, err)
	typo := env["TEMPORAL_TASK_QUEUE"] + "-TYPO"
	code, _, errOut = starter(t, env, "start", "--tenant", "acme", "--order", "cli-typo", "--task-queue", typo)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, `is on task queue "`+typo+`", and no worker has polled that queue lately`)
	code, out, errOut = starter(t, env, "start", "--tenant", "acme", "--order", "cli-typo")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "collapsed into existing run")
	require.Contains(t, errOut, `, not on "`+env["TEMPORAL_TASK_QUEUE"]+`": starting it again joins this run and cannot move it`)
	require.NoError(t, w.Client.TerminateWorkflow(ctx, orders.WorkflowID("acme", "cli-typo"), "", "test over"))
	// create's --task-queue goes into the outbox row: the worker's relay
	// starts the run on the same queue, whoever starts first.
	code, _, errOut = starter(t, env, "create", "--tenant", "acme", "--order", "cli-typo-2", "--amount", "2500", "--currency", "eur",
		"--email", "ann@example.com", "--payment-method", "pm_card_visa", "--task-queue", typo)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, `is on task queue "`+typo+`"`)
	var rowQueue string
	require.NoError(t, w.Pool.QueryRow(ctx, `SELECT task_queue FROM keyed_outbox WHERE workflow_id = $1`,
		orders.WorkflowID("acme", "cli-typo-2")).Scan(&rowQueue))
	require.Equal(t, typo, rowQueue)
	require.NoError(t, w.Client.TerminateWorkflow(ctx, orders.WorkflowID("acme", "cli-typo-2"), "", "test over"))
	// A relay on a queue no worker polls says so at start; on the workers'
	// queue it says nothing.
	var warned bytes.Buffer
	warnRelayQueue(ctx, &warned, w.Client, typo)
	require.Contains(t, warned.String(), `no worker has polled task queue "`+typo+`" lately`)
	warned.Reset()
	warnRelayQueue(ctx, &warned, w.Client, env["TEMPORAL_TASK_QUEUE"])
	require.Empty(t, warned.String())

	// A different order under the same ID is refused.
	code, _, errOut = starter(t, env, "create", "--tenant", "acme", "--order", "cli-1", "--amount", "1",
		"--currency", "eur", "--email", "bob@example.com", "--payment-method", "pm_card_visa")
	require.Equal(t, 2, code, "a refusal of the operator's input")
	require.Contains(t, errOut, "already exists with a different amount")

	code, out, errOut = starter(t, env, "show", "--tenant", "acme", "--order", "cli-1", "--json")
	require.Equal(t, 0, code, errOut)
	var shown showResult
	require.NoError(t, json.Unmarshal([]byte(out), &shown), out)
	require.Equal(t, orders.StatusPaid, shown.Order.Status)
	paidPath := len(orderacts.PaidPath())
	require.Len(t, shown.Effects, paidPath)
	for _, r := range shown.Effects {
		require.Equal(t, effects.StateSucceeded, r.State, r.Key)
		require.NotEmpty(t, r.Result, r.Key)
	}
	require.Empty(t, shown.Workflow.Error)
	require.Len(t, shown.Workflow.Steps, paidPath)
	for _, s := range shown.Workflow.Steps {
		require.Equal(t, "done", s.State, s.Step)
		require.True(t, strings.HasPrefix(s.EffectKey, "acme:order:cli-1:"), s.EffectKey)
	}

	code, out, errOut = starter(t, env, "show", "--tenant", "acme", "--order", "cli-1")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{"status          paid", "acme:order:cli-1:charge", "acme:order:cli-1:mark_paid", "acme:order:cli-1:receipt", "succeeded", "payment_intent_id"} {
		require.Contains(t, out, want)
	}

	code, _, errOut = starter(t, env, "show", "--tenant", "acme", "--order", "missing")
	require.Equal(t, 2, code, "no such order is bad input, not an outage")
	require.Contains(t, errOut, "order not found")
}

// workerEnv is the environment that points the starter at w's database,
// Temporal, namespace and task queue.
func workerEnv(w *fxapptest.Worker) map[string]string {
	env := map[string]string{}
	for _, k := range []string{"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_TASK_QUEUE"} {
		env[k] = w.Env[k]
	}
	return env
}

// closedRun starts a run of the workflow id on a queue nobody polls and
// terminates it: a run that has ended, as after a decision timeout.
func closedRun(t *testing.T, w *fxapptest.Worker, id string) {
	t.Helper()
	ctx := context.Background()
	run, err := w.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: w.Env["TEMPORAL_TASK_QUEUE"] + "-nobody"}, "OrderWorkflow")
	require.NoError(t, err)
	require.NoError(t, w.Client.TerminateWorkflow(ctx, run.GetID(), run.GetRunID(), "test: the run has ended"))
}

// withTemporal adds to env a dev server of the test's own, which has no run
// of any order: resolve settles a record alone there once runDeleted.
func withTemporal(t *testing.T, env map[string]string) map[string]string {
	t.Helper()
	srv := fxapptest.StartServer(t)
	env["TEMPORAL_ADDRESS"], env["TEMPORAL_NAMESPACE"] = srv.Address(), srv.Namespace()
	return env
}

// runDeleted ages k's record past any namespace's retention, as when the
// run that made it closed long ago and has been deleted.
func runDeleted(t *testing.T, db effects.DB, k effects.Key) {
	t.Helper()
	_, err := db.Exec(context.Background(), `UPDATE keyed_effects SET updated_at = now() - interval '400 days' WHERE key = $1`, k.String())
	require.NoError(t, err)
}

func TestResolveSettlesAnAmbiguousEffect(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, nil)
	env := workerEnv(w)
	fxc := w.Effects
	ctx := context.Background()
	key := effects.MustKey("acme", "order", "r1", "receipt")
	closedRun(t, w, orders.WorkflowID("acme", "r1"))
	cl, err := fxc.Claim(ctx, effects.ClaimParams{Key: key, Owner: "wf/receipt"})
	require.NoError(t, err)
	require.NoError(t, fxc.Fail(ctx, cl, effects.NewCodedError("ambiguous", "may have been sent")))

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"resolve", "--key", key.String()}, "--as is required: done or retry; --reason is required"},
		{[]string{"resolve", "--key", "no-tenant", "--as", "retry", "--reason", "x"}, "invalid --key"},
		{[]string{"resolve", "--key", key.String(), "--as", "maybe", "--reason", "x"}, "invalid --as"},
		{[]string{"resolve", "--key", key.String(), "--as", "done", "--reason", "x", "--result", "{"}, "--result is not valid JSON"},
		{[]string{"resolve", "--key", "acme:order:nope:receipt", "--as", "retry", "--by", "ada", "--reason", "x"}, "not found"},
	} {
		code, _, errOut := starter(t, env, c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, "%v", c.args)
	}

	// With no SendGrid key to ask, a done is refused unless unverified.
	done := []string{"resolve", "--key", key.String(), "--as", "done", "--by", "ada",
		"--result", `{"message_id":"sg-123"}`, "--reason", "found in SendGrid activity"}
	code, out, errOut := starter(t, env, done...)
	require.Equal(t, 2, code, errOut)
	require.Empty(t, out)
	require.Contains(t, errOut, "no SendGrid client to ask (SENDGRID_API_KEY is not set)")
	require.Contains(t, errOut, "--unverified")
	code, out, errOut = starter(t, env, append(done, "--unverified")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "is now succeeded")
	require.Contains(t, out, "ada decided done via starter resolve: found in SendGrid activity (unverified: no SendGrid client")
	rec, err := fxc.Get(ctx, key)
	require.NoError(t, err)
	require.JSONEq(t, `{"message_id":"sg-123"}`, string(rec.Result))

	code, _, errOut = starter(t, env, "resolve", "--key", key.String(), "--as", "retry", "--by", "ada", "--reason", "changed my mind")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "cannot be resolved")

	// A done on a succeeded record is refused too, its outcome named, and
	// changes nothing, whether or not its result matches.
	before, err := fxc.Get(ctx, key)
	require.NoError(t, err)
	for _, result := range []string{`{"message_id":"sg-123"}`, `{"message_id":"sg-other"}`} {
		code, out, errOut = starter(t, env, "resolve", "--key", key.String(), "--as", "done", "--by", "ada",
			"--result", result, "--reason", "again", "--unverified")
		require.Equal(t, 2, code, out)
		require.Contains(t, errOut, `cannot be resolved in its state: it is succeeded with the outcome {"message_id": "sg-123"}; nothing changed`)
	}
	after, err := fxc.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, before, after)
}

// A decision on the effect of a run that is still running and does not
// wait for one (retrying the step, or racing another operator who just
// ended its wait) is refused with exit 2 and changes nothing: the run
// settles the step itself, and a record written beside it would race it.
func TestResolveRefusesWhileTheRunRuns(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, nil)
	env := workerEnv(w)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// An open run of the order on a queue no worker polls: running, waiting for nothing.
	run, err := w.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: orders.WorkflowID("acme", "busy-1"),
		TaskQueue: env["TEMPORAL_TASK_QUEUE"] + "-nobody"}, "OrderWorkflow")
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Client.TerminateWorkflow(context.Background(), run.GetID(), run.GetRunID(), "test over") })
	key := effects.MustKey("acme", "order", "busy-1", "receipt")
	cl, err := w.Effects.Claim(ctx, effects.ClaimParams{Key: key, Owner: "wf/receipt"})
	require.NoError(t, err)
	require.NoError(t, w.Effects.Fail(ctx, cl, effects.NewCodedError("transient", "look-up failed")))
	before, err := w.Effects.Get(ctx, key)
	require.NoError(t, err)

	for _, as := range [][]string{{"--as", "retry"}, {"--as", "done", "--result", `{"message_id":"m"}`, "--unverified"}} {
		code, out, errOut := starter(t, env, append([]string{"resolve", "--key", key.String(), "--by", "ada", "--reason", "x"}, as...)...)
		require.Equal(t, 2, code, "%v: %s", as, out)
		require.Contains(t, errOut, "is still running and does not wait for a decision")
		require.Contains(t, errOut, "nothing changed")
	}
	after, err := w.Effects.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, before, after)
}

// A decision is settled in the record alone only when Temporal says no run
// can settle it: with Temporal unreachable resolve exits 1, and with no run
// in a namespace that should still hold it (the record changed within its
// retention) it refuses with exit 2, naming TEMPORAL_NAMESPACE; neither
// changes anything. Once the record is older than the retention, the run
// was deleted and resolve settles the record.
func TestResolveSettlesTheRecordOnlyWhenNoRunCan(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, nil)
	ctx := context.Background()
	key := effects.MustKey("acme", "order", "gone-1", "receipt")
	cl, err := w.Effects.Claim(ctx, effects.ClaimParams{Key: key, Owner: "wf/receipt"})
	require.NoError(t, err)
	require.NoError(t, w.Effects.Fail(ctx, cl, effects.NewCodedError("ambiguous", "may have been sent")))
	before, err := w.Effects.Get(ctx, key)
	require.NoError(t, err)
	retry := []string{"resolve", "--key", key.String(), "--as", "retry", "--by", "ada", "--reason", "not in SendGrid"}

	down := workerEnv(w)
	down["TEMPORAL_ADDRESS"] = "127.0.0.1:1"
	code, out, errOut := starter(t, down, retry...)
	require.Equal(t, 1, code, out)
	require.Contains(t, errOut, "ask Temporal whether the run order:acme:gone-1:fulfil waits")
	require.Contains(t, errOut, "nothing changed")

	batch := []string{"resolve", "--query", "TenantID = 'acme'", "--as", "retry", "--by", "ada", "--reason", "x"}
	code, out, errOut = starter(t, down, batch...)
	require.Equal(t, 1, code, "Temporal down is no usage error: %s%s", out, errOut)
	code, out, errOut = starter(t, workerEnv(w), "resolve", "--query", "TenantID = ", "--as", "retry", "--by", "ada", "--reason", "x")
	require.Equal(t, 2, code, "a malformed query is: %s%s", out, errOut)

	code, out, errOut = starter(t, workerEnv(w), retry...)
	require.Equal(t, 2, code, out)
	require.Contains(t, errOut, "has no run order:acme:gone-1:fulfil")
	require.Contains(t, errOut, "TEMPORAL_NAMESPACE")
	after, err := w.Effects.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, before, after)

	runDeleted(t, w.Pool, key)
	code, out, errOut = starter(t, workerEnv(w), retry...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "is now failed_transient")
}

func TestReconcileExitsThreeOnFindings(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	fake := fakestripe.New(nil)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	const secret = "sk_test_reconcile_cli_0123456789"
	env := map[string]string{"DATABASE_URL": url, "TEMPORAL_ADDRESS": "127.0.0.1:1",
		"STRIPE_SECRET_KEY": secret, "STRIPE_API_BASE": srv.URL}
	with := func(k, v string) map[string]string {
		m := maps.Clone(env)
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	var seen strings.Builder
	reconcileCLI := func(env map[string]string, args ...string) (int, string, string) {
		t.Helper()
		code, out, errOut := starter(t, env, append([]string{"reconcile"}, args...)...)
		seen.WriteString(out + errOut)
		return code, out, errOut
	}

	code, out, _ := reconcileCLI(nil, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "3 when there are findings")
	require.Contains(t, out, "STRIPE_SECRET_KEY")

	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{with("STRIPE_SECRET_KEY", ""), nil, "STRIPE_SECRET_KEY: required"},
		{with("STRIPE_SECRET_KEY", "pk_live_abc"), nil, "must start with sk_ or rk_"},
		{with("STRIPE_API_BASE", "ftp://stripe"), nil, "STRIPE_API_BASE"},
		{env, []string{"--since", "yesterday"}, "invalid --since"},
		{env, []string{"--until", "-1h"}, "invalid --until: -1h is negative"},
		{env, []string{"--since", "1h", "--until", "2h"}, "is not before --until"},
		{env, []string{"--stripe-secret-key", secret}, "flag provided but not defined: --stripe-secret-key"},
	} {
		code, out, errOut := reconcileCLI(c.env, c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, errOut)
		require.Contains(t, errOut, c.want, "%v", c.args)
		require.Empty(t, out)
	}
	require.Zero(t, fake.Requests(), "bad input asks Stripe nothing")

	// A charge done the keyed way: claim, charge under the key, record.
	ctx := context.Background()
	fxc := effectstest.NewClient(t, pool, nil)
	sc, err := stripestep.NewClient(secret, srv.URL, srv.Client())
	require.NoError(t, err)
	charge := func(effectKey, idem string) *stripe.PaymentIntent {
		t.Helper()
		p := &stripe.PaymentIntentParams{Amount: stripe.Int64(1999), Currency: stripe.String("usd"),
			PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true)}
		p.SetIdempotencyKey(idem)
		p.AddMetadata("effect_key", effectKey)
		pi, err := sc.PaymentIntents.New(p)
		require.NoError(t, err)
		return pi
	}
	key := effects.MustKey("acme", "order", "cli-r1", "charge")
	cl, err := fxc.Claim(ctx, effects.ClaimParams{Key: key, Owner: "wf/charge"})
	require.NoError(t, err)
	pi := charge(key.String(), key.String())
	require.NoError(t, fxc.Complete(ctx, cl, orders.ChargeResult{PaymentIntentID: pi.ID, Status: string(pi.Status), AmountMinor: pi.Amount, Currency: string(pi.Currency)}))

	code, out, errOut := reconcileCLI(env, "--since", "1h")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no findings: keyed and Stripe agree")
	require.Regexp(t, `charge records\s+1\n`, out)

	// A charge keyed never recorded.
	lost := charge("acme:order:cli-r2:charge", "manual")
	code, out, errOut = reconcileCLI(env, "--since", "1h", "--json")
	require.Equal(t, 3, code, errOut)
	var rep reconcile.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.Findings, 1)
	require.Equal(t, reconcile.KindMissingRecord, rep.Findings[0].Kind)
	require.Equal(t, "acme:order:cli-r2:charge", rep.Findings[0].EffectKey)
	require.Equal(t, "acme", rep.Findings[0].TenantID)
	require.Equal(t, 1, rep.Records)
	require.Equal(t, 2, rep.PaymentIntents)

	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	code, out, errOut = reconcileCLI(env, "--since", since)
	require.Equal(t, 3, code, errOut)
	for _, want := range []string{"findings         1", "missing_record", "acme:order:cli-r2:charge", lost.ID + " succeeded 19.99 USD", "keyed has no record"} {
		require.Contains(t, out, want)
	}

	// A window that ended before both charges is clean.
	code, out, errOut = reconcileCLI(env, "--since", "3h", "--until", "2h")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no findings")

	require.NotContains(t, seen.String(), secret, "the Stripe key is never printed")
}
