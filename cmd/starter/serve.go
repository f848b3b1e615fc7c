package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapp"
)

// Environment variables of serve, next to the shared ones.
const (
	envAPIAddr    = "KEYED_API_ADDR"
	envServeRelay = "KEYED_SERVE_RELAY"
	defaultAddr   = "127.0.0.1:8080"
)

func runServe(ctx context.Context, e *env, args []string) error {
	f := newFlags(e, "serve", "[flags]",
		"Serves keyed's HTTP API until SIGINT or SIGTERM, then drains in-flight requests:\n"+
			"  POST /v1/orders       create an order and queue its checkout (Idempotency-Key required)\n"+
			"  GET  /v1/orders/{id}  the order, its workflow start and each effect's key, state and outcome\n"+
			"  GET  /healthz         200 when Postgres answers\n"+
			"  GET  /metrics         request, idempotency and effect metrics (unless --metrics=false)\n"+
			"API keys come from the environment only: "+api.EnvKeys+"=\"acme=sk_…,globex=sk_…\", or\n"+
			api.EnvKeysFile+" naming a file with one tenant=key a line. The tenant is the key's.\n"+
			"Each tenant may send KEYED_API_RATE_LIMIT requests a second (default 100) in bursts of\n"+
			"KEYED_API_RATE_BURST (default 200), per API process; beyond that 429 with Retry-After; 0 turns it off.\n"+
			"Orders are started by an outbox relay: the worker runs one; --relay runs one here too, and only\n"+
			"then are the Temporal settings used.")
	addr := f.String("addr", lookupOr(e.lookup, envAPIAddr, defaultAddr), "listen `host:port` (env "+envAPIAddr+")")
	relay := f.Bool("relay", f.loader.Bool(envServeRelay, "relay", false), "also run an outbox relay in this process (env "+envServeRelay+")")
	metrics := f.Bool("metrics", true, "serve /metrics on the API's port")
	var keys *api.Keys
	f.check(func() {
		if err := config.CheckHostPort(*addr); err != nil {
			f.loader.Problem(envAPIAddr+" (--addr)", "%v", err)
		}
		keys = serveKeys(f.loader, e.lookup)
	})
	cfg, err := f.parse(args)
	if err != nil {
		return err
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

// serveKeys loads the API keys, reporting each problem to l. A tenant must
// be able to key its orders and its Idempotency-Keys: ParseKeys refuses one
// longer than api.MaxTenantLen here rather than on each request.
func serveKeys(l *config.Loader, lookup func(string) (string, bool)) *api.Keys {
	keys, err := api.KeysFromEnv(lookup)
	if err != nil {
		name := api.EnvKeys
		if v, ok := lookup(api.EnvKeysFile); ok && strings.TrimSpace(v) != "" {
			name = api.EnvKeysFile
		}
		l.Problem(name, "%s", strings.TrimPrefix(err.Error(), api.EnvKeys+": "))
		return nil
	}
	return keys
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
