package tracing_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/keyedhq/keyed/internal/tracing"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestEnabledIsOffUnlessTheEnvironmentAsks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		env  func(string) (string, bool)
		want bool
	}{
		{"nothing set", env(), false},
		{"exporter otlp", env("OTEL_TRACES_EXPORTER", "otlp"), true},
		{"endpoint", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), true},
		{"traces endpoint", env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/v1/traces"), true},
		{"exporter none wins", env("OTEL_TRACES_EXPORTER", "none", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), false},
		{"sdk disabled wins", env("OTEL_SDK_DISABLED", "true", "OTEL_TRACES_EXPORTER", "otlp"), false},
		{"service name alone", env("OTEL_SERVICE_NAME", "keyed"), false},
	} {
		require.Equal(t, c.want, tracing.Enabled(c.env), c.name)
	}
}

func TestNewWithoutSettingsIsNil(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	tp, err := tracing.New(context.Background(), "keyed")
	require.NoError(t, err)
	require.Nil(t, tp)

	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	_, err = tracing.New(context.Background(), "keyed")
	require.ErrorIs(t, err, tracing.ErrExporter)

	// On, but nothing is sent until a span ends: building makes no call.
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	_, err = tracing.New(context.Background(), "keyed")
	require.ErrorIs(t, err, tracing.ErrExporter, "no gRPC exporter is built in")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	tp, err = tracing.New(context.Background(), "keyed")
	require.NoError(t, err)
	require.NotNil(t, tp)
	require.NoError(t, tp.Shutdown(context.Background()))
}

func TestInjectExtractCarriesTheSpan(t *testing.T) {
	t.Parallel()
	require.Nil(t, tracing.Inject(context.Background()), "no span, nothing stored")
	require.Equal(t, context.Background(), tracing.Extract(context.Background(), nil))
	require.Equal(t, context.Background(), tracing.Extract(context.Background(), []byte("{not json")))

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	b := tracing.Inject(ctx)
	require.Contains(t, string(b), "traceparent")
	tracing.SetEffectKey(ctx, "acme/order/1/charge")
	span.End()

	remote := trace.SpanContextFromContext(tracing.Extract(context.Background(), b))
	require.True(t, remote.IsRemote())
	require.Equal(t, span.SpanContext().TraceID(), remote.TraceID())
	require.Equal(t, span.SpanContext().SpanID(), remote.SpanID())
	got := exp.GetSpans()[0].Attributes
	require.Contains(t, got, tracing.EffectKey.String("acme/order/1/charge"))
}

// BenchmarkOff measures what tracing costs the hot path when it is off:
// the outbox's Inject and the activities' SetEffectKey on a context with
// no span.
func BenchmarkOff(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if tracing.Inject(ctx) != nil {
			b.Fatal("injected")
		}
		tracing.SetEffectKey(ctx, "acme/order/1/charge")
	}
}
