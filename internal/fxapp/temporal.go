package fxapp

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	tlog "go.temporal.io/sdk/log"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/tracing"
)

// TemporalModule provides a Temporal client for the configured frontend,
// namespace and security (config.Temporal), connecting on first use and
// closed on stop. With a prometheus.Registerer the SDK's metrics are recorded
// with a temporal_ prefix; with a trace.TracerProvider the SDK's OpenTelemetry
// interceptor traces starts, workflows and activities.
var TemporalModule = fx.Module("temporal",
	fx.Provide(newTemporalClient),
)

type temporalIn struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Config     config.Temporal
	Logger     *slog.Logger
	Registerer prometheus.Registerer `optional:"true"`
	Tracer     trace.TracerProvider  `optional:"true"`
}

func newTemporalClient(in temporalIn) (client.Client, error) {
	cfg := in.Config
	opts, err := cfg.ClientOptions()
	if err != nil {
		return nil, err
	}
	if cfg.HasAPIKey() && cfg.TLS() == "off" {
		in.Logger.Warn("TEMPORAL_API_KEY goes out in plain text (TEMPORAL_TLS=false): only to a plain-text proxy on a network you trust",
			"temporal_address", cfg.Address)
	}
	opts.Logger = tlog.NewStructuredLogger(in.Logger.With("component", "temporal"))
	if in.Registerer != nil {
		h, err := newSDKMetrics(in.Registerer)
		if err != nil {
			return nil, fmt.Errorf("temporal SDK metrics: %w", err)
		}
		opts.MetricsHandler = h
	}
	if in.Tracer != nil {
		// Also a worker interceptor: workers built on this client trace
		// workflows and activities, continuing the starter's trace.
		ti, err := temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{
			Tracer: in.Tracer.Tracer("go.temporal.io/sdk"), TextMapPropagator: tracing.Propagator,
		})
		if err != nil {
			return nil, fmt.Errorf("temporal tracing: %w", err)
		}
		opts.Interceptors = append(opts.Interceptors, ti)
	}
	c, err := client.NewLazyClient(opts)
	if err != nil {
		return nil, fmt.Errorf("temporal client for %s: %w", cfg.Address, err)
	}
	in.Lifecycle.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			warmUp(ctx, c, in.Logger)
			return nil
		},
		OnStop: func(context.Context) error {
			c.Close()
			return nil
		},
	})
	return c, nil
}

// warmUpTimeout bounds warmUp: a Temporal that is down must not hold up a
// process that works without it until it comes back.
const warmUpTimeout = time.Second

// warmUp makes the client's first call, which reads the server's
// capabilities, before the app's other start hooks call it from several
// goroutines: in the SDK (v1.51) ExecuteWorkflow reads them without a lock
// while a concurrent first call may still be storing them (a data race the
// race detector caught between the relay and `starter relay`'s queue
// check). It only logs a failure: the client reads them on its next call.
func warmUp(ctx context.Context, c client.Client, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, warmUpTimeout)
	defer cancel()
	if _, err := c.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		logger.DebugContext(ctx, "temporal not reachable at start; its client connects on first use", "error", err)
	}
}
