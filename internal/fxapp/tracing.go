package fxapp

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/tracing"
)

// TracingModule provides the app's trace.TracerProvider from the standard
// OTEL_* variables (see internal/tracing): an OTLP/HTTP exporter when they
// ask for traces, and a nil provider otherwise, which leaves everything
// uninstrumented. With a provider, the API serves a span per request, the
// Temporal client and worker carry the trace through workflow starts,
// workflows and activities (the SDK's contrib/opentelemetry interceptor),
// and the Stripe and SendGrid clients record a span per call. OnStop
// flushes and shuts the exporter down. A test replaces the provider with
// fx.Decorate.
var TracingModule = fx.Module("tracing",
	fx.Provide(newTracerProvider),
)

func newTracerProvider(lc fx.Lifecycle) (trace.TracerProvider, error) {
	tp, err := tracing.New(context.Background(), "keyed")
	if err != nil || tp == nil {
		return nil, err
	}
	lc.Append(fx.StopHook(tp.Shutdown))
	return tp, nil
}

// tracedClient returns c with a transport that records a client span per
// request and sends the W3C trace context, or c itself when tp is nil.
func tracedClient(c *http.Client, tp trace.TracerProvider) *http.Client {
	if tp == nil {
		return c
	}
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	c.Transport = otelhttp.NewTransport(base,
		otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(tracing.Propagator))
	return c
}
