// Package tracing sets up OpenTelemetry tracing for keyed's programs from the
// standard OTEL_* variables (off unless they ask for OTLP traces), and
// carries W3C trace context across the outbox (Inject at enqueue, Extract at
// the relay's start). docs/design.md ("Notes moved from the code", internal)
// lists the variables.
package tracing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// EffectKey is the span attribute that names the effect key of an
// activity's or a claim's work.
const EffectKey = attribute.Key("keyed.effect_key")

// Propagator carries the trace context (W3C traceparent and tracestate) and
// baggage across HTTP, Temporal headers and the outbox.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(
	propagation.TraceContext{}, propagation.Baggage{})

// Enabled reports whether the environment read through lookup (os.LookupEnv
// when nil) asks for traces; see the package doc for the rule.
func Enabled(lookup func(string) (string, bool)) bool {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "otlp":
		return true
	case "":
		return get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return false
	}
}

// ErrExporter is wrapped by New's error for a traces exporter other than
// otlp or none, or an OTLP protocol other than http/protobuf.
var ErrExporter = errors.New("unsupported trace exporter")

// New returns a tracer provider exporting over OTLP/HTTP as the process's
// OTEL_* variables say, for serviceName unless OTEL_SERVICE_NAME is set, or
// nil and no error when Enabled is false. It makes no network call; the
// caller must Shutdown it. It returns an error wrapping ErrExporter for an
// unsupported exporter or protocol, and the exporter's or resource's error.
func New(ctx context.Context, serviceName string) (*sdktrace.TracerProvider, error) {
	if exp := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))); exp != "" && exp != "otlp" && exp != "none" {
		return nil, fmt.Errorf("tracing: %w: OTEL_TRACES_EXPORTER=%q: want otlp or none", ErrExporter, exp)
	}
	if !Enabled(nil) {
		return nil, nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if p := strings.TrimSpace(os.Getenv(k)); p != "" && p != "http/protobuf" {
			return nil, fmt.Errorf("tracing: %w: %s=%q: keyed exports over http/protobuf only", ErrExporter, k, p)
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", serviceName)))
	if err == nil {
		res, err = resource.Merge(res, resource.Environment())
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// Inject returns ctx's trace context encoded for an outbox row, or nil
// when ctx carries no valid span (as always when tracing is off), which
// costs no allocation.
func Inject(ctx context.Context) []byte {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	Propagator.Inject(ctx, c)
	b, err := json.Marshal(c)
	if err != nil {
		return nil
	}
	return b
}

// Extract returns ctx carrying the remote trace context Inject encoded in
// b, so that spans started from it join that trace. Empty or malformed b
// returns ctx unchanged: a lost trace context never fails a start.
func Extract(ctx context.Context, b []byte) context.Context {
	if len(b) == 0 {
		return ctx
	}
	var c propagation.MapCarrier
	if err := json.Unmarshal(b, &c); err != nil {
		return ctx
	}
	return Propagator.Extract(ctx, c)
}

// SetEffectKey records key as the EffectKey attribute of ctx's current
// span. Without a recording span (tracing off) it does nothing.
func SetEffectKey(ctx context.Context, key string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(EffectKey.String(key))
	}
}
