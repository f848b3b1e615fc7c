package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/internal/fxapp"
)

// Environment variables of serve, next to the shared ones.
const (
	envAPIAddr    = "KEYED_API_ADDR"
	envServeRelay = "KEYED_SERVE_RELAY"
	defaultAddr   = "127.0.0.1:8080"
)

// serve is the serve command with the process's own environment.
func serve(ctx context.Context, args []string) error {
	return runServe(ctx, &env{stdout: os.Stdout, stderr: os.Stderr, lookup: os.LookupEnv}, args)
}

func runServe(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "serve", "[flags]",
		"Serves keyed's HTTP API until SIGINT or SIGTERM, then drains in-flight requests:\n"+
			"  POST /v1/orders       create an order and queue its checkout (Idempotency-Key required)\n"+
			"  GET  /v1/orders/{id}  the order, its workflow start and each effect's key, state and outcome\n"+
			"  GET  /healthz         200 when Postgres answers\n"+
			"  GET  /metrics         request, idempotency and effect metrics (unless --metrics=false)\n"+
			"API keys come from the environment only: "+api.EnvKeys+"=\"acme=sk_…,globex=sk_…\", or\n"+
			api.EnvKeysFile+" naming a file with one tenant=key a line. The tenant is the key's.\n"+
			"Orders are started by an outbox relay: the worker runs one; --relay runs one here too.")
	addr := f.String("addr", lookupOr(e.lookup, envAPIAddr, defaultAddr), "listen `host:port` (env "+envAPIAddr+")")
	relayDefault, _ := strconv.ParseBool(lookupOr(e.lookup, envServeRelay, "false"))
	relay := f.Bool("relay", relayDefault, "also run an outbox relay in this process (env "+envServeRelay+")")
	metrics := f.Bool("metrics", true, "serve /metrics on the API's port")
	cfg, err := f.parse(args)
	if err != nil {
		return err
	}
	keys, err := api.KeysFromEnv(e.lookup)
	if err != nil {
		return usagef("%v", err)
	}
	logger := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	opts := []fx.Option{
		fx.Supply(fxapp.APIConfig{Addr: *addr, Keys: keys, ServeMetrics: *metrics}),
		fx.Provide(newServeRegistry),
		fxapp.APIModule,
	}
	if *relay {
		opts = append(opts, fxapp.RelayModule)
	}
	var srv *api.Server
	app := fx.New(fxapp.Starter(cfg, logger, append(opts, fx.Populate(&srv))...))
	return fxapp.Run(ctx, app, func(ctx context.Context) error {
		fmt.Fprintf(e.stdout, "serving keyed's API on http://%s (%s; relay %v)\n", srv.Addr(), keys, *relay)
		<-ctx.Done()
		return nil
	})
}

type serveRegistry struct {
	fx.Out
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

func newServeRegistry() serveRegistry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return serveRegistry{Registerer: reg, Gatherer: reg}
}

func lookupOr(lookup func(string) (string, bool), name, def string) string {
	if v, ok := lookup(name); ok && strings.TrimSpace(v) != "" {
		return strings.TrimSpace(v)
	}
	return def
}
