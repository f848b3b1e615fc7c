// Command worker runs keyed's order pipeline: it applies the database
// migrations, registers the order workflow and its activities on the
// Temporal task queue, serves /metrics and /healthz, and on SIGTERM or
// SIGINT stops polling and drains in-flight activities before exiting.
//
// Configuration comes from the environment, with flags for the settings
// that are not secret; run `worker -h` for the list.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
)

// gRPC's gzip at its fastest level (config.UseFastGzip), set before any
// connection.
func init() { config.UseFastGzip() }

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Environ(), os.Stdout, os.Stderr))
}

const usage = `Usage: worker [flags]

Runs the keyed order workflow and its activities on Temporal.

Environment (flags override the non-secret ones; see docs/configuration.md):
`

// run is main without the process: it returns the exit code. environ, as
// os.Environ, is checked for misspelled settings.
func run(args []string, lookup func(string) (string, bool), environ []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		config.Usage(fs.Output(), config.Worker, config.InWorker)
		fmt.Fprint(fs.Output(), "\nFlags:\n")
		config.PrintFlags(fs.Output(), fs)
	}
	l := config.NewLoader(config.Worker, lookup)
	l.Environ(environ)
	cfg, err := l.Parse(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintln(stderr, "worker:", err)
		return 2
	}
	logger := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: cfg.LogLevel}))
	logger.Info("starting worker", "config", cfg)
	return fxapp.Serve(fx.New(fxapp.Worker(cfg, logger)), logger)
}
