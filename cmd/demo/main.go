// Command demo runs keyed's order pipeline end to end on this machine: a
// Temporal dev server with its Web UI, Postgres, the real worker binary, and
// fake Stripe and SendGrid (or the real ones when their keys are set). It
// creates orders, fires duplicate starts, refunds two (one in part, one in
// full), refuses a third refund, and prints what happened. Run it through
// `make demo`; with -keep (make demo KEEP=1) everything stays up until Ctrl-C
// and the starter's settings are written to .demo/env (`source .demo/env`).
// Each demo has its own schema (keyed_demo_ID) and task queue, dropped on exit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// The demo's tenant and namespace, on its own dev server, and where it
// keeps its state. Its schema and task queue are its own too (see
// isolation.go): the CLI reaches them through .demo/env.
const (
	tenant    = "demo"
	namespace = "default"
	stateDir  = ".demo"
)

// options are the demo's flags.
type options struct {
	keep        bool
	uiPort      int
	metricsPort int
	workerBin   string
	duplicates  int
}

func main() {
	var o options
	flag.BoolVar(&o.keep, "keep", os.Getenv("KEEP") != "", "keep the dev server, Web UI and worker running until Ctrl-C, and write .demo/env (or set KEEP=1)")
	flag.IntVar(&o.uiPort, "ui-port", 8233, "Web UI `port` (0 picks a free one)")
	flag.IntVar(&o.metricsPort, "metrics-port", 9464, "the worker's metrics `port` (0 picks a free one)")
	flag.StringVar(&o.workerBin, "worker", "bin/worker", "worker `binary` to run")
	flag.IntVar(&o.duplicates, "duplicates", 5, "concurrent starts fired at each order")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// run starts everything, runs the scenarios, prints the report and, with
// keep, waits for ctx to end. Whatever it started is stopped on return,
// and an error stopping it, or writing to out, is returned with any other.
func run(ctx context.Context, o options, out io.Writer) (err error) {
	if o.duplicates < 1 {
		return fmt.Errorf("-duplicates %d: want at least 1", o.duplicates)
	}
	env := envPath()
	if err := resetState(env); err != nil {
		return err
	}
	w := &errWriter{w: out}
	st := &stack{out: w}
	defer func() { err = joinErr(err, st.close(), removeOwnEnv(env, st.envWritten), w.unreported(err)) }()
	if err := st.start(ctx, o); err != nil {
		return err
	}
	list := scenarios(st.stamp())
	if err := st.runScenarios(ctx, list, o.duplicates); err != nil {
		return err
	}
	refundList := refundScenarios(list)
	if err := st.runRefunds(ctx, refundList, o.duplicates); err != nil {
		return err
	}
	if err := st.report(ctx, list, refundList, o.duplicates); err != nil {
		return err
	}
	if !o.keep {
		return st.printStopped()
	}
	return st.keep(ctx, env, list[0].id)
}

// resetState makes the state directory and removes the env file an earlier
// run left, unless that demo still runs: a gone demo's points at servers
// that are gone.
func resetState(env string) error {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return fmt.Errorf("make %s: %w", stateDir, err)
	}
	return removeStaleEnv(env)
}

// errWriter is an io.Writer that keeps the first error and writes nothing
// after it, so that the progress lines (stack.say) need no check each: run
// returns the error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	if err != nil {
		e.err = fmt.Errorf("write the report: %w", err)
	}
	return n, e.err
}

// unreported returns the writer's error unless err already holds it.
func (e *errWriter) unreported(err error) error {
	if e.err == nil || errors.Is(err, e.err) {
		return nil
	}
	return e.err
}
