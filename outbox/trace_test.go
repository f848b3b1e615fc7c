package outbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// An order enqueued within a span carries that span's trace context in its
// row, and the relay starts it within that trace; one enqueued without a
// span (tracing off) stores NULL and starts with no trace.
func TestRelayStartsARowWithinItsEnqueuingTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	traced, span := tp.Tracer("test").Start(b.ctx, "POST /v1/orders")
	defer span.End()
	for ctx, id := range map[context.Context]string{traced: "ord_traced", b.ctx: "ord_plain"} {
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, _, err := b.store.CreateAndEnqueueTx(ctx, tx, b.newOrder(id))
			return err
		}))
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE trace_context ? 'traceparent'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM keyed_outbox WHERE trace_context IS NULL`))

	var mu sync.Mutex
	seen := map[string]trace.SpanContext{}
	starter := outbox.StarterFunc(func(ctx context.Context, req outbox.Request) (*outbox.Started, error) {
		in, _, err := orders.FromStartRequest(req)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		seen[in.OrderID] = trace.SpanContextFromContext(ctx)
		return &outbox.Started{WorkflowID: req.WorkflowID, RunID: "run-" + in.OrderID, Created: true}, nil
	})
	r, err := outbox.NewRelay(b.pool, starter, &outbox.RelayOpts{Logger: b.logger})
	require.NoError(t, err)
	n, err := r.Poll(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, span.SpanContext().TraceID(), seen["ord_traced"].TraceID())
	require.Equal(t, span.SpanContext().SpanID(), seen["ord_traced"].SpanID())
	require.True(t, seen["ord_traced"].IsRemote())
	require.False(t, seen["ord_plain"].IsValid())
}
