package main

import (
	"context"
	"fmt"
	"log/slog"

	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/fxapp"
)

func runRelay(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "relay", "[--json] [flags]",
		"Runs an outbox relay on its own until SIGINT or SIGTERM: it starts the checkout of every committed\n"+
			"order whose start has not reached Temporal yet, then marks it sent. Every worker already runs one;\n"+
			"run this where starts must flow while no worker is up. Several relays may run at once.")
	asJSON := f.Bool("json", false, "print the start-up line as JSON")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	// SchemaModule first: it refuses a schema without keyed's tables before
	// the relay starts polling one.
	var tc client.Client
	app := fx.New(fxapp.Starter(cfg, logger, fxapp.SchemaModule, fxapp.RelayModule, fx.Populate(&tc)))
	return fxapp.Run(ctx, app, func(ctx context.Context) error {
		var err error
		if *asJSON {
			err = writeJSON(e.stdout, relayStatus{Relay: "running", TemporalAddress: cfg.Temporal.Address,
				Namespace: cfg.Temporal.Namespace, TaskQueue: cfg.Temporal.TaskQueue})
		} else {
			_, err = fmt.Fprintf(e.stdout, "outbox relay running against %s (namespace %s, task queue %s)\n",
				cfg.Temporal.Address, cfg.Temporal.Namespace, cfg.Temporal.TaskQueue)
		}
		if err != nil {
			return err
		}
		warnRelayQueue(ctx, e.stderr, tc, cfg.Temporal.TaskQueue)
		<-ctx.Done()
		return nil
	})
}

// relayStatus is what relay prints with --json once it runs.
type relayStatus struct {
	Relay           string `json:"relay"` // "running"
	TemporalAddress string `json:"temporal_address"`
	Namespace       string `json:"temporal_namespace"`
	TaskQueue       string `json:"task_queue"`
}
