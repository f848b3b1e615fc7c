package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/dbtest"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/internal/logbuf"
	"github.com/keyedhq/keyed/migrations"
	"github.com/keyedhq/keyed/orders"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

func TestMissingConfigurationIsOneMessage(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(nil, fxapptest.Lookup(map[string]string{"STRIPE_SECRET_KEY": "pk_live_oops"}), nil, &stdout, &stderr)
	require.Equal(t, 2, code)
	require.Empty(t, stdout.String())
	msg := stderr.String()
	require.Equal(t, 1, strings.Count(msg, "invalid worker configuration"))
	for _, v := range []string{"STRIPE_SECRET_KEY: must start with sk_ or rk_", "SENDGRID_API_KEY: required", "RECEIPT_FROM (--receipt-from): required"} {
		require.Contains(t, msg, v)
	}
	require.NotContains(t, msg, "pk_live_oops", "a secret is never echoed")
}

// runOffline runs the worker in-process on databaseURL (plus extra
// settings) with no Temporal to reach, and returns its exit code and
// everything it printed.
func runOffline(t *testing.T, databaseURL string, extra map[string]string) (int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := fxapptest.Required(config.InWorker)
	env["DATABASE_URL"] = databaseURL
	env["TEMPORAL_ADDRESS"] = "127.0.0.1:1"
	env["TEMPORAL_CONFIG_FILE"] = filepath.Join(t.TempDir(), "none.toml")
	env["METRICS_ADDR"] = "127.0.0.1:0"
	maps.Copy(env, extra)
	code := run(nil, fxapptest.Lookup(env), fxapptest.Environ(env), &stdout, &stderr)
	return code, stdout.String() + stderr.String()
}

// A pool smaller than the worker needs is bad configuration, found when
// the app is built: the worker says why and exits 2, as for any other bad
// setting.
func TestTooSmallPoolExitsTwo(t *testing.T) {
	t.Parallel()
	code, out := runOffline(t, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable&pool_max_conns=1", nil)
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "pool_max_conns=1 is below the 4 connections the worker needs")
}

// A worker that migrates nothing at start refuses a schema without keyed's
// tables, naming the fix, instead of starting and failing every activity.
func TestUnmigratedSchemaExitsTwo(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	code, out := runOffline(t, url, map[string]string{"MIGRATE_ON_START": "false"})
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "keyed's tables are missing from")
	require.Contains(t, out, "run `starter migrate` against it")
}

// A misspelled setting is refused before anything starts, naming the
// setting meant, instead of running with that setting's default.
func TestMisspelledSettingExitsTwo(t *testing.T) {
	t.Parallel()
	code, out := runOffline(t, "postgres://127.0.0.1:1/none", map[string]string{"WORKER_MAX_ACTIVITES": "2", "MIGRATE_ON_STRAT": "false"})
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "invalid worker configuration (2 problems)")
	require.Contains(t, out, "WORKER_MAX_ACTIVITES: not a setting; did you mean WORKER_MAX_ACTIVITIES?")
	require.Contains(t, out, "MIGRATE_ON_STRAT: not a setting; did you mean MIGRATE_ON_START?")
}

// A search_path naming no existing schema is bad configuration, said as
// such, whether the worker migrates at start or not.
func TestSearchPathWithoutASchemaExitsTwo(t *testing.T) {
	t.Parallel()
	schema, _ := effectstest.NewSchema(t)
	url := effectstest.WithSearchPath(effectstest.DatabaseURL(), schema+"_absent")
	for _, migrate := range []string{"true", "false"} {
		code, out := runOffline(t, url, map[string]string{"MIGRATE_ON_START": migrate})
		require.Equal(t, 2, code, out)
		require.Contains(t, out, "DATABASE_URL's search_path ("+schema+"_absent) names no existing schema")
		require.Contains(t, out, "create the schema, or fix DATABASE_URL's search_path")
	}
}

// A schema a newer build migrated further does not stop the worker (the
// migrations keep older builds working), but it says so at start.
func TestSchemaAheadOfTheBuildIsLogged(t *testing.T) {
	t.Parallel()
	_, url := effectstest.NewSchema(t)
	pool := dbtest.Connect(t, url)
	all, err := migrations.All()
	require.NoError(t, err)
	next := all[len(all)-1].Version + 1
	_, err = pool.Exec(context.Background(), `INSERT INTO keyed_schema_migrations (version, name) VALUES ($1, 'newer.sql')`, next)
	require.NoError(t, err)

	_, out := runOffline(t, url, map[string]string{"MIGRATE_ON_START": "false"})
	require.Contains(t, out, "the schema is ahead of this build")
	require.Contains(t, out, fmt.Sprintf(`"app_ahead":[%d]`, next))
	require.NotContains(t, out, "keyed's tables are missing")
}

// TestHelpListsTheEnvironment checks -h against the settings table: every
// variable the worker reads, and every flag of them.
func TestHelpListsTheEnvironment(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run([]string{"-h"}, fxapptest.Lookup(nil), nil, &stdout, &stderr))
	env, flags, _ := strings.Cut(stderr.String(), "\nFlags:\n")
	listed := regexp.MustCompile(`(?m)^  --([a-z-]+)`).FindAllStringSubmatch(flags, -1)
	var want []string
	for _, s := range config.Settings {
		if s.For&config.InWorker == 0 {
			continue
		}
		require.Regexp(t, `(?m)^  `+regexp.QuoteMeta(s.Env)+`( |$)`, env)
		if s.Flag != "" {
			want = append(want, s.Flag)
		}
	}
	var got []string
	for _, m := range listed {
		got = append(got, m[1])
	}
	require.ElementsMatch(t, want, got, "the worker's flags are its settings'")
}

// TestSIGTERMDrainsAnInFlightActivity runs the worker binary, sends it
// SIGTERM while a charge is in flight, and checks that it waits for the
// charge to finish and record its effect, then exits 0.
func TestSIGTERMDrainsAnInFlightActivity(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	metricsAddr := freeAddr(t)
	deps := fxapptest.Prepare(t, &fxapptest.Opts{Env: map[string]string{"METRICS_ADDR": metricsAddr}})

	bin := filepath.Join(t.TempDir(), "worker")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range deps.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var logs, errs logbuf.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &errs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + metricsAddr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 100*time.Millisecond, "the worker answers /healthz\nstdout:\n%s\nstderr:\n%s", &logs, &errs)

	pool, err := pgxpool.New(ctx, deps.Env["DATABASE_URL"])
	require.NoError(t, err)
	defer pool.Close()
	store, err := orders.NewStore(pool)
	require.NoError(t, err)
	o, _, err := store.Create(ctx, orders.NewOrder{TenantID: "acme", ID: "drain-1", AmountMinor: 1200, Currency: "usd",
		CustomerEmail: "dee@example.com", PaymentMethod: "pm_card_visa"})
	require.NoError(t, err)
	tc, err := client.Dial(client.Options{HostPort: deps.Env["TEMPORAL_ADDRESS"], Logger: quiet{}})
	require.NoError(t, err)
	defer tc.Close()

	deps.Stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultLatency, Delay: 3 * time.Second})
	_, err = orderflow.Start(ctx, tc, orders.NewOrderInput("acme", "drain-1"), &orderflow.StartOpts{TaskQueue: deps.Env["TEMPORAL_TASK_QUEUE"], Order: o})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return deps.Stripe.Requests() > 0 }, 30*time.Second, 20*time.Millisecond, "the charge reaches Stripe")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err
		require.NoError(t, err, "the worker exits 0 after draining\nstdout:\n%s\nstderr:\n%s", &logs, &errs)
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not exit within 30s of SIGTERM\n%s", &logs)
	}

	require.Equal(t, 1, deps.Stripe.Charges())
	key, err := orders.NewOrderInput("acme", "drain-1").EffectKey(orders.StepCharge)
	require.NoError(t, err)
	fxc, err := effects.NewClient(pool, nil)
	require.NoError(t, err)
	rec, err := fxc.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State, "the in-flight charge finished and recorded its outcome before exit")

	// Every log line is JSON, the lifecycle is logged, and no secret is.
	var msgs []string
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "log line %q", sc.Text())
		msgs = append(msgs, line.Msg)
	}
	for _, want := range []string{"starting worker", "worker polling", "stopping", "worker draining", "worker stopped", "stopped"} {
		require.Contains(t, msgs, want)
	}
	require.NotContains(t, logs.String(), deps.Env["STRIPE_SECRET_KEY"])
	require.NotContains(t, logs.String(), deps.Env["SENDGRID_API_KEY"])
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

type quiet struct{}

func (quiet) Debug(string, ...any) {}
func (quiet) Info(string, ...any)  {}
func (quiet) Warn(string, ...any)  {}
func (quiet) Error(string, ...any) {}
