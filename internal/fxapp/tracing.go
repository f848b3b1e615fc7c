package fxapp

import (
	"context"
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/tracing"
)

// TracingModule provides the app's trace.TracerProvider from the OTEL_*
// variables (internal/tracing), nil when they ask for no traces. With a
// provider the API, the Temporal client and worker, and the Stripe and
// SendGrid clients record spans. OnStop flushes and shuts the exporter down.
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
