package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/doctor"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
)

// exitCodeError ends a command with its own exit code, after the command
// printed what it had to say.
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// maxDoctorDays bounds doctor --days: ten years, far past any retention,
// and far from overflowing a time.Duration.
const maxDoctorDays = 3650

func runDoctor(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "doctor", "[--rules FILE] [--metrics-url URL] [--days 7] [--json] [flags]",
		"Checks the deployment that DATABASE_URL and TEMPORAL_* point at against keyed's hardening\n"+
			"checklist, and prints each check as PASS, WARN or FAIL with its evidence and its fix:\n"+
			"  classified         every activity declares an effect class and key step; sampled claims have keys of that shape\n"+
			"  timeouts           each start-to-close timeout against the p99 of measured claim-to-finish times (warn < 3x, fail < 1x)\n"+
			"  lease              the claim lease against the interval at which it is renewed\n"+
			"  retention          EFFECTS_RETENTION against the namespace's retention and the longest run; Idempotency-Key\n"+
			"                     and outbox retention\n"+
			"  search_attributes  TenantID, OrderID and KeyedAttention registered as Keyword\n"+
			"  pool               the worker's pool (DATABASE_URL pool_max_conns) against what its slots, relay, listener and prune need\n"+
			"  dead_letters       runs waiting for a decision or failed (order not final) in the last --days, and their alerts in --rules\n"+
			"  suppression        Temporal's activity retries (recent histories) against the retries and duplicates the guard saw\n"+
			"  reconcile          the last successful 'starter reconcile' within --reconcile-every\n"+
			"\n"+
			"It reads the workers' settings from the same environment: EFFECTS_RETENTION, DECISION_TIMEOUT and\n"+
			"WORKER_MAX_ACTIVITIES (or the flags). It only reads.\n"+
			"\n"+
			"Exit status: 0 when every check passed, 3 when some warned, 4 when one failed, 1 when one could\n"+
			"not be made (and none failed), 2 for bad input.",
		config.MigrateFlag)
	asJSON := f.Bool("json", false, "print the report as JSON")
	rules := f.String("rules", "", "the deployed Prometheus rules `file` (such as deploy/prometheus/keyed.rules.yml), checked for dead-letter alerts")
	metricsURL := f.String("metrics-url", "", "a worker's /metrics `URL`, read for keyed_effect_duplicates_suppressed_total")
	days := f.Int("days", 7, fmt.Sprintf("how many `days` back to read effect records and runs (at most %d)", maxDoctorDays))
	checks := f.String("checks", "", "comma-separated `checks` to run (default all): "+strings.Join(doctor.AllChecks, ","))
	reconcileEvery := f.Duration("reconcile-every", 25*time.Hour, "how often reconciliation must succeed")
	f.check(func() {
		if *days < 1 || *days > maxDoctorDays {
			f.loader.Problem("--days", "%d is not between 1 and %d", *days, maxDoctorDays)
		}
		if *rules != "" {
			if _, err := os.Stat(*rules); err != nil {
				f.loader.Problem("--rules", "cannot read %s: %v", *rules, errors.Unwrap(err))
			}
		}
		if u, err := url.Parse(*metricsURL); *metricsURL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
			f.loader.Problem("--metrics-url", "%q is not an http(s) URL", *metricsURL)
		}
		if *reconcileEvery <= 0 {
			f.loader.Problem("--reconcile-every", "%s must be positive", *reconcileEvery)
		}
		for _, c := range splitChecks(*checks) {
			if !contains(doctor.AllChecks, c) {
				f.loader.Problem("--checks", "%q is not one of %s", c, strings.Join(doctor.AllChecks, ", "))
			}
		}
	})
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	wcfg := *cfg
	wcfg.Role = config.Worker // the worker settings doctor judges were read for it (config.InDoctor)
	opts := fxapp.DoctorOpts(&wcfg, nil)
	opts.Checks, opts.RulesFile, opts.MetricsURL = splitChecks(*checks), *rules, *metricsURL
	opts.Window, opts.ReconcileEvery = time.Duration(*days)*24*time.Hour, *reconcileEvery

	var (
		pool *pgxpool.Pool
		tc   client.Client
	)
	return f.runApp(ctx, cfg, func(ctx context.Context) error {
		rep, err := doctor.Run(ctx, doctor.Deps{Pool: pool, Temporal: tc}, &opts)
		if err != nil {
			return err
		}
		if *asJSON {
			err = writeJSON(e.stdout, rep)
		} else {
			err = rep.WriteText(e.stdout)
		}
		if err != nil {
			return err
		}
		if code := rep.ExitCode(); code != doctor.ExitPass {
			return &exitCodeError{code: code}
		}
		return nil
	}, &pool, &tc)
}

// splitChecks splits a --checks value; empty means nil (every check).
func splitChecks(s string) []string {
	var out []string
	for _, c := range strings.Split(s, ",") {
		if c = strings.TrimSpace(c); c != "" {
			out = append(out, c)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
