package fxapp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.temporal.io/sdk/client"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/config"
)

// healthTimeout bounds each dependency check of /healthz.
const healthTimeout = 2 * time.Second

// MetricsModule provides a Prometheus registry (with the Go runtime and
// process collectors) as the app's prometheus.Registerer, and serves it on
// METRICS_ADDR at /metrics, next to /healthz, which answers 200 when
// Postgres and Temporal both answer and 503 naming the failed check
// otherwise. The listener opens in OnStart, so a taken port fails the start;
// OnStop shuts the server down gracefully. The Postgres pool's statistics
// are exported as keyed_db_pool_* gauges and counters.
var MetricsModule = fx.Module("metrics",
	fx.Provide(newRegistry, newMetricsServer),
	fx.Invoke(func(*MetricsServer) {}),
)

type registryOut struct {
	fx.Out
	Registry   *prometheus.Registry
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

func newRegistry() registryOut {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return registryOut{Registry: reg, Registerer: reg, Gatherer: reg}
}

// MetricsServer serves /metrics and /healthz.
type MetricsServer struct {
	srv  *http.Server
	mu   sync.Mutex
	addr string
}

// Addr returns the address the server listens on, once started: the
// configured one, with the real port if it was 0.
func (m *MetricsServer) Addr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addr
}

type metricsIn struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Config     config.Metrics
	Gatherer   prometheus.Gatherer
	Registerer prometheus.Registerer
	Pool       *pgxpool.Pool
	Temporal   client.Client
	Logger     *slog.Logger
}

func newMetricsServer(in metricsIn) (*MetricsServer, error) {
	if err := in.Registerer.Register(newPoolCollector(in.Pool)); err != nil {
		return nil, fmt.Errorf("register the database pool metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(in.Gatherer, promhttp.HandlerOpts{}))
	mux.Handle("GET /healthz", healthz(in.Pool, in.Temporal))
	m := &MetricsServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	logger := in.Logger.With("component", "metrics")
	in.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ln, err := net.Listen("tcp", in.Config.Addr)
			if err != nil {
				return fmt.Errorf("serve /metrics on METRICS_ADDR %s: %w", in.Config.Addr, err)
			}
			m.mu.Lock()
			m.addr = ln.Addr().String()
			m.mu.Unlock()
			logger.Info("serving /metrics and /healthz", "addr", "http://"+ln.Addr().String())
			go func() {
				if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					logger.Error("metrics server failed", "err", err)
				}
			}()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			return m.srv.Shutdown(ctx)
		},
	})
	return m, nil
}

type healthReport struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

func healthz(pool *pgxpool.Pool, tc client.Client) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		report := healthReport{Status: "ok", Checks: map[string]string{}}
		check := func(name string, fn func(ctx context.Context) error) {
			ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
			defer cancel()
			if err := fn(ctx); err != nil {
				report.Status = "unavailable"
				report.Checks[name] = err.Error()
				return
			}
			report.Checks[name] = "ok"
		}
		check("postgres", pool.Ping)
		check("temporal", func(ctx context.Context) error {
			_, err := tc.CheckHealth(ctx, &client.CheckHealthRequest{})
			return err
		})
		w.Header().Set("Content-Type", "application/json")
		if report.Status != "ok" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(report)
	})
}
