package fxapp

import (
	"fmt"
	"log/slog"

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
	in.Lifecycle.Append(fx.StopHook(c.Close))
	return c, nil
}
