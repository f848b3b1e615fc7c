package main

import (
	"context"
	"fmt"
	"log/slog"

	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/fxapp"
)

func runRelay(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "relay", "[flags]",
		"Runs an outbox relay on its own until SIGINT or SIGTERM: it starts the checkout of every committed\n"+
			"order whose start has not reached Temporal yet, then marks it sent. Every worker already runs one;\n"+
			"run this where starts must flow while no worker is up. Several relays may run at once.")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	app := fx.New(fxapp.Starter(cfg, logger, fxapp.RelayModule))
	return fxapp.Run(ctx, app, func(ctx context.Context) error {
		fmt.Fprintf(e.stdout, "outbox relay running against %s (task queue %s)\n", cfg.Temporal.Address, cfg.Temporal.TaskQueue)
		<-ctx.Done()
		return nil
	})
}
