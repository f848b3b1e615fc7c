package fxapp_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/internal/fxapi"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/internal/tracing"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// TestTracingLinksTheOrderRequestToTheStripeCall runs the API, the relay
// and the worker in one app with an in-memory span exporter, creates an
// order with POST /v1/orders, and checks that one trace runs from that
// request, through the outbox row and the relay's workflow start, to the
// Stripe and SendGrid HTTP calls, whose activity spans name the effect key.
func TestTracingLinksTheOrderRequestToTheStripeCall(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	keys, err := api.ParseKeys("acme=sk_test_tracing_0123456789")
	require.NoError(t, err)
	var srv *api.Server
	w := fxapptest.Start(t, &fxapptest.Opts{Extra: []fx.Option{
		fx.Decorate(func(trace.TracerProvider) trace.TracerProvider { return tp }),
		fx.Supply(fxapi.Config{Addr: "127.0.0.1:0", Keys: keys}),
		fx.Supply(&outbox.RelayOpts{PollInterval: 50 * time.Millisecond}),
		fxapi.Module,
		fx.Populate(&srv),
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	body := `{"order_id":"traced-1","amount_minor":1999,"currency":"usd","customer_email":"ann@example.com","payment_method":"pm_card_visa"}`
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+srv.Addr()+"/v1/orders", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_tracing_0123456789")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(api.HeaderIdempotencyKey, "traced-1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// The Stripe calls, and SendGrid's send (not the start's probe of its
	// Email Activity API, which belongs to no request).
	stripeHost := strings.TrimPrefix(w.Env["STRIPE_API_BASE"], "http://") + "/"
	sendgridHost := strings.TrimPrefix(w.Env["SENDGRID_API_BASE"], "http://") + "/v3/mail/send"
	// A span is exported when it ends, so an HTTP call shows up before the
	// activity span around it: wait for both.
	require.Eventually(t, func() bool {
		o, err := w.Orders.Get(ctx, "acme", "traced-1")
		spans := exp.GetSpans()
		return err == nil && o.Status == orders.StatusPaid &&
			callsWithParents(spans, stripeHost) && callsWithParents(spans, sendgridHost)
	}, time.Minute, 50*time.Millisecond, "the order is paid and the provider calls and their activities are traced")
	require.Equal(t, 1, w.Stripe.Charges())

	spans := exp.GetSpans()
	server := findSpan(t, spans, func(s tracetest.SpanStub) bool {
		return s.SpanKind == trace.SpanKindServer && s.Name == "POST /v1/orders"
	})
	traceID := server.SpanContext.TraceID()
	// The relay's start continues the request's span, which it can only
	// know from the outbox row.
	start := findSpan(t, spans, func(s tracetest.SpanStub) bool { return strings.HasPrefix(s.Name, "StartWorkflow:") })
	require.Equal(t, traceID, start.SpanContext.TraceID(), "the relay's start is in the request's trace")
	require.Equal(t, server.SpanContext.SpanID(), start.Parent.SpanID(), "the start's parent is the request's span")

	in := orders.NewOrderInput("acme", "traced-1")
	for step, prefix := range map[string]string{orders.StepCharge: stripeHost, orders.StepReceipt: sendgridHost} {
		key, err := in.EffectKey(step)
		require.NoError(t, err)
		calls := clientSpans(spans, prefix)
		require.NotEmpty(t, calls, step)
		for _, call := range calls {
			require.Equal(t, traceID, call.SpanContext.TraceID(), "the %s call is in the request's trace", step)
			parent := findSpan(t, spans, func(s tracetest.SpanStub) bool { return s.SpanContext.SpanID() == call.Parent.SpanID() })
			require.Equal(t, key.String(), effectKey(call)+effectKey(parent), "%s: the call or its activity span names the effect key", step)
		}
	}
}

// callsWithParents reports whether there are client spans to prefix and
// every one's parent span has ended too.
func callsWithParents(spans tracetest.SpanStubs, prefix string) bool {
	calls := clientSpans(spans, prefix)
	for _, call := range calls {
		found := false
		for _, s := range spans {
			found = found || s.SpanContext.SpanID() == call.Parent.SpanID()
		}
		if !found {
			return false
		}
	}
	return len(calls) > 0
}

// clientSpans returns the HTTP client spans of requests whose URL, without
// its scheme, starts with prefix, but for the worker's scheduled jobs'
// (the reconciliation with Stripe), which belong to no request.
func clientSpans(spans tracetest.SpanStubs, prefix string) []tracetest.SpanStub {
	scheduled := map[trace.TraceID]bool{}
	for _, s := range spans {
		if strings.HasPrefix(s.Name, "schedule ") {
			scheduled[s.SpanContext.TraceID()] = true
		}
	}
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanKind != trace.SpanKindClient || scheduled[s.SpanContext.TraceID()] {
			continue
		}
		for _, a := range s.Attributes {
			if a.Key == "url.full" && strings.HasPrefix(a.Value.AsString(), "http://"+prefix) {
				out = append(out, s)
			}
		}
	}
	return out
}

func findSpan(t *testing.T, spans tracetest.SpanStubs, match func(tracetest.SpanStub) bool) tracetest.SpanStub {
	t.Helper()
	for _, s := range spans {
		if match(s) {
			return s
		}
	}
	names := make([]string, 0, len(spans))
	for _, s := range spans {
		names = append(names, s.Name)
	}
	require.FailNow(t, "no such span", "spans: %v", names)
	return tracetest.SpanStub{}
}

func effectKey(s tracetest.SpanStub) string {
	for _, a := range s.Attributes {
		if a.Key == tracing.EffectKey {
			return a.Value.AsString()
		}
	}
	return ""
}
