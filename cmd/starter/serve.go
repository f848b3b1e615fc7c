package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"go.uber.org/fx"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapi"
	"github.com/keyedhq/keyed/internal/fxapp"
)

func runServe(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "serve", "[flags]",
		"Serves keyed's HTTP API until SIGINT or SIGTERM, then drains in-flight requests:\n"+
			"  POST /v1/orders       create an order and queue its checkout (Idempotency-Key required)\n"+
			"  GET  /v1/orders/{id}  the order, its workflow start and each effect's key, state and outcome\n"+
			"  GET  /healthz         200 when Postgres answers\n"+
			"and, on METRICS_ADDR (--metrics-addr), never on the API's port, unless --metrics=false:\n"+
			"  GET  /metrics         request, idempotency and effect metrics of every tenant\n"+
			"  GET  /healthz         200 when Postgres and Temporal answer\n"+
			"API keys come from the environment only (KEYED_API_KEYS or KEYED_API_KEYS_FILE); the tenant is\n"+
			"the key's. Each tenant may send KEYED_API_RATE_LIMIT requests a second in bursts of\n"+
			"KEYED_API_RATE_BURST, per API process; beyond that 429 with Retry-After.\n"+
			"Orders are started by an outbox relay: the worker runs one; --relay runs one here too. A POST with\n"+
			"Prefer: wait=N (at most KEYED_API_MAX_WAIT) starts or joins the run itself and answers with its outcome.")
	metrics := f.Bool("metrics", true, "serve /metrics and /healthz on METRICS_ADDR")
	var keys *api.Keys
	f.loader.Check(func(c *config.Config, add func(string, string, ...any)) { keys = serveKeys(c.API, add) })
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	opts := []fx.Option{
		fx.Supply(fxapi.Config{Addr: cfg.API.Addr, Keys: keys, MaxWait: cfg.API.MaxWait, MaxConns: cfg.API.MaxConns}),
		fxapi.Module,
		fxapp.SchemaModule,
	}
	var ms *fxapp.MetricsServer
	if *metrics {
		opts = append(opts, fxapp.MetricsModule, fx.Populate(&ms))
	}
	if cfg.API.Relay {
		opts = append(opts, fxapp.RelayModule)
	}
	var srv *api.Server
	app := fx.New(fxapp.Starter(cfg, logger, append(opts, fx.Populate(&srv))...))
	return fxapp.Run(ctx, app, func(ctx context.Context) error {
		fmt.Fprintf(e.stdout, "serving keyed's API on http://%s (%s; relay %v)\n", srv.Addr(), keys, cfg.API.Relay)
		if ms != nil {
			fmt.Fprintf(e.stdout, "serving /metrics and /healthz on http://%s\n", ms.Addr())
		}
		<-ctx.Done()
		return nil
	})
}

// serveKeys loads the API keys, reporting a problem to add. A tenant must
// be able to key its orders and its Idempotency-Keys: ParseKeys refuses one
// longer than api.MaxTenantLen here rather than on each request.
func serveKeys(c config.API, add func(string, string, ...any)) *api.Keys {
	keys, err := api.KeysFrom(string(c.Keys), c.KeysFile)
	if err != nil {
		name := api.EnvKeys
		if strings.TrimSpace(c.KeysFile) != "" {
			name = api.EnvKeysFile
		}
		add(name, "%v", err)
		return nil
	}
	return keys
}
