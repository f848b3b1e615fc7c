// Package fxapptest runs keyed's real worker app in a test: a Temporal dev
// server (internal/devserver), a fresh Postgres schema, and the providers'
// fakes on httptest servers (Stripe's and SendGrid's its own, to count
// at), wired by fxapp.Worker exactly as cmd/worker wires them.
package fxapptest

import (
	"context"
	"crypto/rand"
	"flag"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/effects/effectstest"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fakeproviders"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/migrations"
	"github.com/keyedhq/keyed/orders"
)

// Opts configures Start. A nil *Opts means all defaults.
type Opts struct {
	// Server is a running dev server to share. Nil starts a headless one
	// for this test and stops it at cleanup.
	Server *devserver.Server
	// Env overrides or adds worker environment variables.
	Env map[string]string
	// Logger receives the app's logs. Nil logs warnings and errors to
	// stderr.
	Logger *slog.Logger
	// Extra options are appended to the worker app's, such as more
	// modules or a decorated dependency.
	Extra []fx.Option
}

// Deps is what a worker talks to: a dev server, a fresh schema and the
// provider fakes, described by a complete worker environment.
type Deps struct {
	Server   *devserver.Server
	Stripe   *fakestripe.Server
	SendGrid *fakesendgrid.Server
	// Env is the complete worker environment, for this app, a starter, or a
	// worker process pointed at the same database and task queue.
	Env map[string]string
}

// Worker is a started worker app and what it talks to.
type Worker struct {
	*Deps
	App    *fx.App
	Config *config.Config

	Client  client.Client
	Pool    *pgxpool.Pool
	Orders  *orders.Store
	Effects *effects.Client
	Metrics *fxapp.MetricsServer

	stopped bool
}

// StartServer starts a headless Temporal dev server and stops it when the
// test ends. It fails the test, saying how to build the binary, when bin/
// has none.
func StartServer(t testing.TB) *devserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv, err := devserver.Start(ctx, devserver.ForTests())
	require.NoError(t, err, "start the Temporal dev server (run `make tools` to build bin/temporal)")
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

// InstalledAgo makes d's schema an install of age ago: it applies keyed's
// migrations now and dates them back by age, so that the checks that give a
// new install time (doctor's reconcile) treat it as an old one.
func InstalledAgo(t testing.TB, d *Deps, age time.Duration) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, d.Env["DATABASE_URL"])
	require.NoError(t, err)
	defer pool.Close()
	_, err = migrations.Apply(ctx, pool, &migrations.Opts{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE keyed_schema_migrations SET applied_at = applied_at - $1::interval`, age)
	require.NoError(t, err)
}

// Prepare starts (or shares) a dev server, creates a fresh schema, serves
// the fakes on httptest servers, and returns them with the environment of
// a worker using them on its own task queue.
func Prepare(t testing.TB, opts *Opts) *Deps {
	t.Helper()
	if opts == nil {
		opts = &Opts{}
	}
	srv := opts.Server
	if srv == nil {
		srv = StartServer(t)
	}
	_, dbURL := effectstest.NewSchema(t)
	d := &Deps{Server: srv, Stripe: fakestripe.New(nil), SendGrid: fakesendgrid.New(nil)}
	stripeSrv := httptest.NewServer(d.Stripe)
	t.Cleanup(stripeSrv.Close)
	sendgridSrv := httptest.NewServer(d.SendGrid)
	t.Cleanup(sendgridSrv.Close)

	d.Env = map[string]string{
		"DATABASE_URL":        dbURL,
		"TEMPORAL_ADDRESS":    srv.Address(),
		"TEMPORAL_NAMESPACE":  srv.Namespace(),
		"TEMPORAL_TASK_QUEUE": "keyed-test-" + randomID(),
		"STRIPE_SECRET_KEY":   "sk_test_fxapptest",
		"STRIPE_API_BASE":     stripeSrv.URL,
		"SENDGRID_API_KEY":    "SG.fxapptest",
		"SENDGRID_API_BASE":   sendgridSrv.URL,
		"RECEIPT_FROM":        "Keyed Receipts <receipts@keyed.test>",
		"METRICS_ADDR":        "127.0.0.1:0",
		"WORKER_STOP_TIMEOUT": "10s",
		// The worker's reconciliation would add its Stripe requests to what
		// every test counts; the tests of the schedule turn it on.
		"RECONCILE_EVERY": "0",
		// A developer's own ~/.config/temporalio/temporal.toml must not
		// point the test at another cluster.
		"TEMPORAL_CONFIG_FILE": filepath.Join(t.TempDir(), "no-temporal.toml"),
	}
	// A provider this helper does not fake itself gets the fake of
	// internal/fakeproviders' table, and a setting the worker requires that
	// it does not set (a new provider's key) its row's example, so adding a
	// provider breaks no test.
	fakeproviders.ServeT(t, d.Env)
	for k, v := range Required(config.InWorker) {
		if _, ok := d.Env[k]; !ok {
			d.Env[k] = v
		}
	}
	for k, v := range opts.Env {
		d.Env[k] = v
	}
	return d
}

// Start builds and starts the worker app on Prepare's dependencies, and
// stops it (if the test did not) when the test ends.
func Start(t testing.TB, opts *Opts) *Worker {
	t.Helper()
	if opts == nil {
		opts = &Opts{}
	}
	w, err := StartOn(t, Prepare(t, opts), opts.Logger, opts.Extra...)
	require.NoError(t, err, "start the worker app")
	return w
}

// StartOn builds and starts the worker app on d, whose Env the caller may
// have edited, and stops it (if the test did not) when the test ends. It
// returns the error of building or starting the app, reduced to its root
// cause, for tests of configurations the worker refuses. Extra options are
// appended to the app's.
func StartOn(t testing.TB, d *Deps, logger *slog.Logger, extra ...fx.Option) (*Worker, error) {
	t.Helper()
	w := &Worker{Deps: d}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg, err := config.Load(config.Worker, fs, nil, Lookup(w.Env))
	require.NoError(t, err)
	w.Config = cfg

	if logger == nil {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	w.App = fx.New(fxapp.Worker(cfg, logger,
		fx.Populate(&w.Client, &w.Pool, &w.Orders, &w.Effects, &w.Metrics), fx.Options(extra...)))
	if err := w.App.Err(); err != nil {
		return nil, fxapp.RootCause(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.App.StartTimeout())
	defer cancel()
	if err := w.App.Start(ctx); err != nil {
		return nil, fxapp.RootCause(err)
	}
	t.Cleanup(func() {
		if !w.stopped {
			_ = w.Stop()
		}
	})
	return w, nil
}

// Stop stops the app within its stop timeout and returns the stop's error.
func (w *Worker) Stop() error {
	w.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), w.App.StopTimeout())
	defer cancel()
	return w.App.Stop(ctx)
}

// Providers returns the provider clients the worker hands its steps, built
// by fxapp.ProvidersModule as the worker builds them, from env (a worker's
// settings, such as Deps.Env) over pool and claims; the app is built, not
// started. A test that binds steps with clients of its own puts them first
// (pipeline.Provider takes the first of a type) and these after, so that a
// step added with a provider of its own finds its client.
func Providers(t testing.TB, env map[string]string, pool *pgxpool.Pool, claims *effects.Client) []any {
	t.Helper()
	cfg, err := config.NewLoader(config.Worker, Lookup(env)).Load()
	require.NoError(t, err, "the providers' settings")
	var out struct {
		fx.In
		Providers []any `group:"providers"`
	}
	app := fx.New(fx.NopLogger, fx.Supply(cfg, slog.New(slog.DiscardHandler), pool, claims),
		fxapp.ConfigModule, fxapp.ProvidersModule, fx.Populate(&out))
	require.NoError(t, app.Err(), "build the providers")
	return out.Providers
}

// Required returns the settings the programs in u require, each set to
// its row's example (config.Setting.Example).
func Required(u config.Uses) map[string]string { return config.RequiredExamples(u) }

// Environ returns env as os.Environ lists it, "NAME=value", sorted.
func Environ(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// Lookup returns an os.LookupEnv over env.
func Lookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}
}

// randomID returns 8 random lowercase letters and digits.
func randomID() string {
	return strings.ToLower(rand.Text())[:8]
}
