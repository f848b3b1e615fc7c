// Package fxapi is the fx module that serves keyed's HTTP API. It is apart
// from fxapp so that the worker, which serves no API, does not link package api.
package fxapi

import (
	"cmp"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox/temporalstart"
	"github.com/keyedhq/keyed/pipeline"
)

// Config is what Module needs beyond the shared configuration. The
// program supplies it (fx.Supply), because the API keys are secrets read
// from the environment by the command that serves.
type Config struct {
	// Addr is the listen address, host:port; port 0 picks a free one.
	Addr string
	// Keys maps bearer API keys to tenants (api.KeysFrom).
	Keys *api.Keys
	// ServeMetrics mounts the app's prometheus.Gatherer at /metrics on the
	// API's port, for an app with no MetricsModule serving it elsewhere.
	ServeMetrics bool
	// MaxWait is the longest Prefer: wait honoured (config.API.MaxWait),
	// with the app's Temporal client; zero ignores the preference.
	MaxWait time.Duration
	// MaxConns caps the connections the server holds open
	// (api.ServerOpts.MaxConns); zero means api.DefaultMaxConns.
	MaxConns int
}

// Module serves keyed's HTTP API on Config.Addr: OnStart binds the port (a
// taken port fails the start), OnStop drains within the stop timeout. It
// prunes idempotency records hourly, registers request metrics and spans
// when the app has a Registerer or TracerProvider, and applies
// config.RateLimit per tenant in this process. With the app's Temporal
// client, POST /v1/orders and refunds honour Prefer: wait.
var Module = fx.Module("api",
	fx.Provide(newAPIHandler, newAPIServer),
	fx.Invoke(func(*api.Server) {}),
)

type apiIn struct {
	fx.In
	Config     Config
	RateLimit  config.RateLimit
	Pool       *pgxpool.Pool
	Effects    *effects.Client
	Logger     *slog.Logger
	Registerer prometheus.Registerer `optional:"true"`
	Gatherer   prometheus.Gatherer   `optional:"true"`
	// With a Temporal client, POST routes honour Prefer: wait, starting
	// runs with the relay's options (every spec's Configure).
	Temporal       client.Client   `optional:"true"`
	TemporalConfig config.Temporal `optional:"true"`
	Specs          []pipeline.Spec `optional:"true"`
}

func newAPIHandler(in apiIn) (*api.Handler, error) {
	if in.Config.Keys == nil {
		return nil, errors.New("api: no API keys: set " + api.EnvKeys + " or " + api.EnvKeysFile)
	}
	opts := &api.HandlerOpts{Effects: in.Effects, Logger: in.Logger.With("component", "api"),
		RateLimit: api.RateLimit{Rate: in.RateLimit.Rate, Burst: in.RateLimit.Burst}}
	if in.Temporal != nil && in.Config.MaxWait > 0 {
		opts.MaxWait = in.Config.MaxWait
		opts.Starter = temporalstart.New(in.Temporal, &temporalstart.Opts{TaskQueue: cmp.Or(in.TemporalConfig.TaskQueue, orders.TaskQueue),
			Configure: pipeline.Configure(in.Specs, in.Pool)})
	}
	if in.Registerer != nil {
		m, err := api.NewMetrics(in.Registerer)
		if err != nil {
			return nil, err
		}
		opts.Metrics = m
	}
	if in.Config.ServeMetrics {
		if in.Gatherer == nil {
			return nil, errors.New("api: ServeMetrics is set but the app has no prometheus.Gatherer")
		}
		opts.Gatherer = in.Gatherer
	}
	return api.NewHandler(in.Pool, in.Config.Keys, opts)
}

type apiServerIn struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Handler   *api.Handler
	Logger    *slog.Logger
	Tracer    trace.TracerProvider `optional:"true"`
}

func newAPIServer(in apiServerIn) (*api.Server, error) {
	lc, cfg, h, logger := in.Lifecycle, in.Config, in.Handler, in.Logger
	s, err := api.NewServer(cfg.Addr, h, &api.ServerOpts{Logger: logger.With("component", "api"), TracerProvider: in.Tracer,
		MaxConns: cfg.MaxConns})
	if err != nil {
		return nil, err
	}
	lc.Append(fx.Hook{OnStart: s.Start, OnStop: s.Stop})
	return s, nil
}
