package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fakeproviders"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/migrations"
	"github.com/keyedhq/keyed/orders"
)

// stack is everything the demo runs, and how to stop it.
type stack struct {
	// out keeps its first write error, which run returns.
	out *errWriter
	// id names this demo's schema, task queue and worker log.
	id          string
	schema      string
	taskQueue   string
	srv         *devserver.Server
	dbURL       string
	pool        *pgxpool.Pool
	metricsAddr string
	stripeFake  *fakestripe.Server
	logPath     string
	tc          client.Client
	store       *orders.Store
	claims      *effects.Client
	started     time.Time
	// envWritten is what keep wrote to .demo/env, removed on exit only
	// if the file still holds it.
	envWritten []byte
	// stops run in reverse order on close.
	stops []func() error
}

// say prints a progress line. A failed write is kept in s.out, and run
// returns it.
func (s *stack) say(format string, args ...any) {
	fmt.Fprintf(s.out, "▸ "+format+"\n", args...)
}

// start brings up the dev server, Postgres schema, providers, worker and
// clients, in that order.
func (s *stack) start(ctx context.Context, o options) error {
	s.started = time.Now()
	id, err := newID()
	if err != nil {
		return err
	}
	s.id, s.schema, s.taskQueue = id, schemaPrefix+id, taskQueuePrefix+id
	for _, step := range []func(context.Context, options) error{
		s.startTemporal, s.prepareDB, s.startWorker, s.dial,
	} {
		if err := step(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

// stamp makes the run's order IDs unique.
func (s *stack) stamp() string { return s.started.Format("150405.0") }

func (s *stack) startTemporal(ctx context.Context, o options) error {
	uiPort := o.uiPort
	if uiPort != 0 && !portFree(uiPort) {
		s.say("port %d is busy; the Web UI gets a free port instead", uiPort)
		uiPort = 0
	}
	s.say("starting the Temporal dev server (bin/temporal) with its Web UI and tenant fairness on")
	srv, err := devserver.Start(ctx, &devserver.Opts{UIPort: uiPort, DynamicConfig: devserver.Recommended()})
	if err != nil {
		return err
	}
	s.srv = srv
	s.stops = append(s.stops, srv.Stop)
	return nil
}

func (s *stack) prepareDB(ctx context.Context, _ options) error {
	s.say("demo %s: Postgres schema %s, task queue %s", s.id, s.schema, s.taskQueue)
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		base = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	// This connection holds the schema's lock for the demo's life, and
	// drops the schema when the demo stops.
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return fmt.Errorf("connect to Postgres (run `make postgres`): %w", err)
	}
	dropped, err := claimSchema(ctx, conn, s.schema)
	for _, d := range dropped {
		s.say("dropped schema %s, left by a demo that is gone", d)
	}
	if err != nil {
		return joinErr(err, conn.Close(context.WithoutCancel(ctx)))
	}
	s.stops = append(s.stops, func() error { return dropSchema(conn, s.schema) })
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	s.dbURL = base + sep + "search_path=" + s.schema
	pool, err := pgxpool.New(ctx, s.dbURL)
	if err != nil {
		return err
	}
	s.pool = pool
	s.stops = append(s.stops, func() error { pool.Close(); return nil })
	if _, err := migrations.Apply(ctx, pool, &migrations.Opts{Logger: slog.New(slog.DiscardHandler)}); err != nil {
		return fmt.Errorf("migrate schema %s: %w", s.schema, err)
	}
	return nil
}

// withProviders returns env with the worker's settings for its providers:
// the real Stripe (test mode) and SendGrid when their keys are set,
// otherwise a fake Stripe the demo counts charges at and, from
// internal/fakeproviders' table, a fake of every other provider; and the
// example of every other setting the worker requires.
func (s *stack) withProviders(env []string) []string {
	if os.Getenv("STRIPE_SECRET_KEY") != "" && os.Getenv("SENDGRID_API_KEY") != "" {
		s.say("using real Stripe (test mode) and SendGrid: their keys are set")
		return fakeproviders.WithExamples(append(env, "STRIPE_SECRET_KEY="+os.Getenv("STRIPE_SECRET_KEY"),
			"SENDGRID_API_KEY="+os.Getenv("SENDGRID_API_KEY")))
	}
	s.say("starting fake Stripe and SendGrid (set STRIPE_SECRET_KEY and SENDGRID_API_KEY for the real ones)")
	s.stripeFake = fakestripe.New(nil)
	st := httptest.NewServer(s.stripeFake)
	env, stop := fakeproviders.Complete(append(env, "STRIPE_SECRET_KEY=sk_test_demo", "STRIPE_API_BASE="+st.URL,
		"SENDGRID_API_KEY=SG.demo"))
	s.stops = append(s.stops, func() error { st.Close(); stop(); return nil })
	return env
}

// startWorker starts the worker binary, its output in .demo/worker.log,
// with the settings to reach the demo and its providers.
func (s *stack) startWorker(_ context.Context, o options) error {
	env, err := s.workerEnv(o)
	if err != nil {
		return err
	}
	s.say("starting the worker: %s", o.workerBin)
	s.logPath = filepath.Join(stateDir, "worker-"+s.id+".log")
	logFile, err := os.Create(s.logPath)
	if err != nil {
		return fmt.Errorf("create the worker log: %w", err)
	}
	worker := exec.Command(o.workerBin)
	worker.Env = append(os.Environ(), env...)
	worker.Stdout, worker.Stderr = logFile, logFile
	worker.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := worker.Start(); err != nil {
		return joinErr(fmt.Errorf("start worker (run `make demo`, which builds it): %w", err), logFile.Close())
	}
	s.stops = append(s.stops, func() error { return s.stopWorker(worker, logFile) })
	return nil
}

// workerEnv picks the worker's metrics address (o.metricsPort unless it
// is 0 or taken, then a free one) and returns the worker's settings,
// starting the fake providers if needed.
func (s *stack) workerEnv(o options) ([]string, error) {
	port := o.metricsPort
	if port == 0 || !portFree(port) {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	s.metricsAddr = fmt.Sprintf("127.0.0.1:%d", port)
	env := append(s.cliEnv(), "METRICS_ADDR="+s.metricsAddr)
	if os.Getenv("RECEIPT_FROM") == "" {
		env = append(env, "RECEIPT_FROM=receipts@keyed.example")
	}
	return s.withProviders(env), nil
}

// stopWorker sends the worker SIGTERM, on which it drains and exits 0,
// waits for it and closes its log.
func (s *stack) stopWorker(worker *exec.Cmd, logFile *os.File) error {
	err := worker.Process.Signal(syscall.SIGTERM)
	if werr := worker.Wait(); werr != nil {
		err = joinErr(err, fmt.Errorf("worker (see %s): %w", s.logPath, werr))
	}
	return joinErr(err, logFile.Close())
}

func (s *stack) dial(_ context.Context, _ options) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tc, err := client.Dial(client.Options{HostPort: s.srv.Address(), Namespace: namespace, Logger: sdklog.NewStructuredLogger(quiet)})
	if err != nil {
		return fmt.Errorf("connect to the dev server: %w", err)
	}
	s.tc = tc
	s.stops = append(s.stops, func() error { tc.Close(); return nil })
	if s.store, err = orders.NewStore(s.pool); err != nil {
		return err
	}
	s.claims, err = effects.NewClient(s.pool, &effects.ClientOpts{Logger: quiet})
	return err
}

// cliEnv is what the worker and the starter CLI need to reach the demo.
func (s *stack) cliEnv() []string {
	return []string{
		"DATABASE_URL=" + s.dbURL,
		"TEMPORAL_ADDRESS=" + s.srv.Address(),
		"TEMPORAL_NAMESPACE=" + namespace,
		"TEMPORAL_TASK_QUEUE=" + s.taskQueue,
	}
}

// close stops everything started, last first, and returns every error.
func (s *stack) close() error {
	var err error
	for i := len(s.stops) - 1; i >= 0; i-- {
		err = joinErr(err, s.stops[i]())
	}
	s.stops = nil
	return err
}

// keep writes .demo/env, prints how to use it, and waits for Ctrl-C.
func (s *stack) keep(ctx context.Context, path, someOrder string) error {
	vars := append(s.cliEnv(),
		"KEYED_DEMO_ID="+s.id,
		"KEYED_DEMO_TENANT="+tenant,
		"KEYED_DEMO_WEB_UI="+s.webUI(),
		"KEYED_DEMO_METRICS=http://"+s.metricsAddr+"/metrics",
	)
	written, err := writeEnvFile(path, s.id, vars)
	if err != nil {
		return err
	}
	s.envWritten = written
	if err := printKeep(s.out, path, vars, someOrder, s.logPath); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// webUI links to the demo tenant's runs in the Web UI.
func (s *stack) webUI() string {
	return fmt.Sprintf("%s/namespaces/%s/workflows?query=TenantID%%3D%%22%s%%22", s.srv.UIAddress(), namespace, tenant)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	return l.Close() == nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// joinErr is errors.Join, kept short for deferred cleanups.
func joinErr(errs ...error) error { return errors.Join(errs...) }
