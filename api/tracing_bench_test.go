package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/keyedhq/keyed/api"
)

// BenchmarkCreateOrderTracing measures POST /v1/orders (fresh keys, 16
// concurrent clients) through api.Server with tracing off (no
// TracerProvider: no middleware) and on (a server span per request, batched
// to an exporter that drops them), side by side in one run. Both report
// req/s.
//
//	go test -run '^$' -bench CreateOrderTracing -benchtime 3s ./api
func BenchmarkCreateOrderTracing(b *testing.B) {
	for _, mode := range []string{"off", "on"} {
		bd := setup(b)
		var tp trace.TracerProvider
		if mode == "on" {
			sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
			tp = sdk
		}
		srv, err := api.NewServer("127.0.0.1:0", bd.handler, &api.ServerOpts{Logger: bd.logger, TracerProvider: tp, PruneInterval: -1})
		require.NoError(b, err)
		require.NoError(b, srv.Start(context.Background()))
		b.Cleanup(func() { _ = srv.Stop(context.Background()) })
		base := "http://" + srv.Addr()
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		var seq atomic.Int64
		b.Run("tracing="+mode, func(b *testing.B) {
			runConcurrent(b, 16, func() int {
				n := seq.Add(1)
				req, err := http.NewRequest("POST", base+"/v1/orders", strings.NewReader(orderBody(fmt.Sprintf("ord_%d", n), 1999)))
				if err != nil {
					b.Fatal(err)
				}
				req.Header.Set("Authorization", "Bearer "+bd.keyA)
				req.Header.Set(api.HeaderIdempotencyKey, fmt.Sprintf("k-%d", n))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_ = resp.Body.Close()
				return resp.StatusCode
			}, http.StatusCreated)
		})
	}
}
