package fxapp_test

import (
	"flag"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// loadConfig builds a validated configuration for role from env alone.
func loadConfig(t *testing.T, role config.Role, env map[string]string) *config.Config {
	t.Helper()
	fs := flag.NewFlagSet(role.String(), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg, err := config.Load(role, fs, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	require.NoError(t, err)
	return cfg
}

func workerEnv() map[string]string {
	env := fxapptest.Required(config.InWorker)
	env["METRICS_ADDR"] = "127.0.0.1:0"
	return env
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestWorkerGraphIsComplete(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, config.Worker, workerEnv())
	require.NoError(t, fx.ValidateApp(fxapp.Worker(cfg, quiet(),
		fx.Invoke(func(worker.Worker, *fxapp.MetricsServer, *effects.Client, client.Client) {}))))
}

func TestStarterGraphIsComplete(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, config.Starter, nil)
	require.NoError(t, fx.ValidateApp(fxapp.Starter(cfg, quiet(),
		fx.Invoke(func(*orders.Store, *effects.Client, client.Client) {}))))
}

// `starter relay` runs the relay on the starter's graph, without a worker.
func TestStarterRelayGraphIsComplete(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, config.Starter, nil)
	require.NoError(t, fx.ValidateApp(fxapp.Starter(cfg, quiet(), fxapp.RelayModule,
		fx.Invoke(func(*outbox.Relay) {}))))
}

func TestStarterGraphHasNoWorker(t *testing.T) {
	t.Parallel()
	cfg := loadConfig(t, config.Starter, nil)
	// The starter must never poll the task queue or need provider keys.
	require.Error(t, fx.ValidateApp(fxapp.Starter(cfg, quiet(), fx.Invoke(func(worker.Worker) {}))))
}
