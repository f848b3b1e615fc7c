package main

import (
	"context"
	"encoding/json"
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
)

func TestDoctorAgainstAWorker(t *testing.T) {
	t.Parallel()
	w := fxapptest.Start(t, nil)
	env := map[string]string{}
	for _, k := range []string{"DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_TASK_QUEUE", "TEMPORAL_CONFIG_FILE"} {
		env[k] = w.Env[k]
	}
	code, out, errOut := starter(t, env, "doctor", "-h")
	require.Equal(t, 0, code, errOut)
	for _, f := range []string{"--rules", "--metrics-url", "--days", "--checks", "--json", "--effects-retention", "--decision-timeout", "--max-activities"} {
		require.Regexp(t, `(?m)^  `+f+`( |$)`, out)
	}
	require.Contains(t, out, "4 when one failed")
	for _, bad := range [][]string{{"--days", "0"}, {"--days", "106752"}, {"--reconcile-every", "-1h"}, {"--checks", "classified,nope"},
		{"--rules", "/nonexistent/keyed.rules.yml"}, {"--metrics-url", "localhost:9464/metrics"}} {
		code, _, errOut := starter(t, env, append([]string{"doctor"}, bad...)...)
		require.Equal(t, 2, code, "%v: %s", bad, errOut)
	}

	code, _, errOut = starter(t, env, "create", "--tenant", "acme", "--order", "doc-1", "--amount", "2500", "--currency", "eur",
		"--email", "bob@example.com", "--payment-method", "pm_card_visa")
	require.Equal(t, 0, code, errOut)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, w.Client.GetWorkflow(ctx, orders.WorkflowID("acme", "doc-1"), "").Get(ctx, nil))

	args := []string{"doctor", "--rules", "../../deploy/prometheus/keyed.rules.yml", "--metrics-url", "http://" + w.Metrics.Addr() + "/metrics"}
	// A new install: its first reconciliation is not due yet.
	code, out, errOut = starter(t, env, append(args, "--checks", "reconcile")...)
	require.Equal(t, doctor.ExitPass, code, out+errOut)
	require.Regexp(t, `(?m)^PASS\s+reconcile\s+deployment\s+no reconciliation recorded yet: keyed's tables were created `, out)
	// Installed two days ago, reconciliation never ran: the one failure.
	_, err := w.Pool.Exec(ctx, `UPDATE keyed_schema_migrations SET applied_at = applied_at - interval '48 hours'`)
	require.NoError(t, err)
	code, out, errOut = starter(t, env, args...)
	require.Equal(t, doctor.ExitFailures, code, out+errOut)
	require.Regexp(t, `(?m)^FAIL\s+reconcile\s+deployment\s+no successful reconciliation`, out)
	require.Regexp(t, `(?m)^PASS\s+classified\s+Charge\s+class external_create, step charge; 1 sampled claim `, out)
	require.Contains(t, out, "exit 4")

	_, err = w.Pool.Exec(ctx, `INSERT INTO keyed_reconcile_runs (window_from, window_to, records, payment_intents, in_flight, findings)
VALUES (now() - interval '25 hours', now(), 1, 1, 0, 0)`)
	require.NoError(t, err)
	code, out, errOut = starter(t, env, append(args, "--json")...)
	require.Equal(t, doctor.ExitPass, code, out+errOut)
	var rep doctor.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Equal(t, 0, rep.Exit)
	for _, c := range rep.Checks {
		require.Equal(t, doctor.StatusPass, c.Status, "%s %s: %s", c.Name, c.Subject, c.Evidence)
	}
	require.Contains(t, rep.Find(doctor.CheckSuppression, "Charge")[0].Evidence, "suppressed 0 duplicates (http://"+w.Metrics.Addr()+"/metrics")

	// A worker setting that undercuts the namespace fails, and so does a tiny pool.
	short := maps.Clone(env)
	short["EFFECTS_RETENTION"] = "24h"
	short["DATABASE_URL"] = env["DATABASE_URL"] + "&pool_max_conns=3"
	code, out, errOut = starter(t, short, "doctor", "--checks", "retention,pool")
	require.Equal(t, doctor.ExitFailures, code, out+errOut)
	require.Regexp(t, `(?m)^FAIL\s+retention\s+EFFECTS_RETENTION\s+EFFECTS_RETENTION 24h0m0s is shorter than namespace "default"'s retention`, out)
	require.Regexp(t, `(?m)^FAIL\s+pool\s+worker\s+pool_max_conns=3: the worker needs at least 4`, out)

	// Temporal unreachable: the checks that need it could not be made.
	gone := maps.Clone(env)
	gone["TEMPORAL_ADDRESS"] = "127.0.0.1:1"
	code, out, errOut = starter(t, gone, "doctor", "--checks", "retention,pool")
	require.Equal(t, doctor.ExitError, code, out+errOut)
	require.Regexp(t, `(?m)^ERROR\s+retention\s+EFFECTS_RETENTION\s+could not check: describe namespace "default"`, out)
	require.Contains(t, out, "3 pass, 0 warn, 0 fail, 1 could not check: exit 1")
}
