package fxapp

import (
	"fmt"
	"log/slog"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/config"
)

// TemporalModule provides a Temporal client for the configured frontend and
// namespace. The client connects on first use, so building the app never
// waits on the network (the worker checks the connection when it starts);
// it is closed on stop.
var TemporalModule = fx.Module("temporal",
	fx.Provide(newTemporalClient),
)

func newTemporalClient(lc fx.Lifecycle, cfg config.Temporal, logger *slog.Logger) (client.Client, error) {
	c, err := client.NewLazyClient(client.Options{
		HostPort:  cfg.Address,
		Namespace: cfg.Namespace,
		Logger:    tlog.NewStructuredLogger(logger.With("component", "temporal")),
	})
	if err != nil {
		return nil, fmt.Errorf("temporal client for %s: %w", cfg.Address, err)
	}
	lc.Append(fx.StopHook(c.Close))
	return c, nil
}
