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
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
)

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

const usage = `Usage: worker [flags]

Runs the keyed order workflow and its activities on Temporal.

Environment (flags override the non-secret ones):
  DATABASE_URL          Postgres connection string (default %q)
  TEMPORAL_ADDRESS      Temporal frontend host:port (default %q)
  TEMPORAL_NAMESPACE    Temporal namespace (default %q)
  TEMPORAL_TASK_QUEUE   task queue (default %q)
  TEMPORAL_API_KEY, TEMPORAL_TLS, TEMPORAL_TLS_CLIENT_CERT_PATH, TEMPORAL_TLS_CLIENT_KEY_PATH,
  TEMPORAL_TLS_SERVER_CA_CERT_PATH, TEMPORAL_TLS_SERVER_NAME, TEMPORAL_CONFIG_FILE, TEMPORAL_PROFILE
                        TLS, mTLS and API key for a Temporal cluster or Temporal Cloud (see deploy/README.md)
  OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME
                        OpenTelemetry tracing over OTLP/HTTP, off unless set (see deploy/README.md)
  STRIPE_SECRET_KEY     required: sk_… or rk_… (environment only)
  STRIPE_API_BASE       Stripe API base URL (default %q)
  SENDGRID_API_KEY      required (environment only)
  SENDGRID_API_BASE     SendGrid API base URL (default %q)
  SENDGRID_LOOKUP_LAG   how long SendGrid's Email Activity index may lag a send (default %s)
  SENDGRID_LOOKUP_GIVE_UP  how much longer a failing look-up is retried (default %s)
  RECEIPT_FROM          required: the receipts' sender address
  RECEIPT_POLICY        at_most_once or at_least_once (default %q)
  COLLAPSE_WINDOW       drop repeat receipts within this duration (default %s)
  METRICS_ADDR          host:port for /metrics and /healthz (default %q)
  MIGRATE_ON_START      apply migrations on start (default true)
  WORKER_STOP_TIMEOUT   drain time for in-flight activities on SIGTERM (default %s)
  WORKER_MAX_ACTIVITIES most concurrent activities (default %d)
  WORKER_POLLERS        workflow-task and activity-task pollers, each (default %d)
  DECISION_TIMEOUT      how long a run waits for an operator's decision before it fails (default %s)
  EFFECTS_RETENTION     prune finished effect records older than this (default %s)
  PRUNE_EVERY           prune once per window of this length, across replicas (default %s)
  LOG_LEVEL             debug, info, warn or error (default "info")

Flags:
`

// run is main without the process: it returns the exit code.
func run(args []string, lookup func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), usage, config.DefaultDatabaseURL, config.DefaultTemporalAddress, config.DefaultTemporalNamespace,
			orders.TaskQueue, config.DefaultStripeAPIBase, config.DefaultSendGridAPIBase, notify.DefaultLookupLag, notify.DefaultLookupGiveUp,
			config.DefaultReceiptPolicy, config.DefaultCollapseWindow, config.DefaultMetricsAddr, config.DefaultStopTimeout,
			config.DefaultMaxActivities, config.DefaultPollers, config.DefaultDecisionTimeout, config.DefaultEffectsRetention, config.DefaultPruneEvery)
		config.PrintFlags(fs.Output(), fs)
	}
	cfg, err := config.Load(config.Worker, fs, args, lookup)
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
