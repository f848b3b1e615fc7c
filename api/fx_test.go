package api_test

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/api"
	"github.com/keyedhq/keyed/internal/config"
	"github.com/keyedhq/keyed/internal/fxapi"
	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

type testRegistry struct {
	fx.Out
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
}

// The graph `starter serve --relay` builds: the API and a relay in the
// starter app. Start returns with the port bound, the relay starts what
// the API queued, and Stop drains both.
func TestAPIAndRelayModulesServeAndStartWorkflows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := map[string]string{"DATABASE_URL": b.url, "TEMPORAL_ADDRESS": temporalAddr, "TEMPORAL_TASK_QUEUE": b.taskQueue}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg, err := config.Load(config.Starter, fs, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	require.NoError(t, err)
	keys, err := api.ParseKeys(b.keyList)
	require.NoError(t, err)

	var srv *api.Server
	reg := prometheus.NewRegistry()
	app := fx.New(fxapp.Starter(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)),
		fx.Supply(fxapi.Config{Addr: "127.0.0.1:0", Keys: keys, ServeMetrics: true}),
		fx.Provide(func() testRegistry { return testRegistry{Registerer: reg, Gatherer: reg} }),
		fx.Supply(&outbox.RelayOpts{PollInterval: 20 * time.Millisecond, StatsInterval: 20 * time.Millisecond}),
		fxapi.Module,
		fxapp.RelayModule,
		fx.Populate(&srv),
	))
	require.NoError(t, fxapp.RootCause(app.Err()))
	startCtx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, app.Start(startCtx))
	base := "http://" + srv.Addr()

	r := doAt(t, http.DefaultClient, base, "POST", "/v1/orders", b.keyA, "fx-1", orderBody("ord_fx", 10))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	wf := orders.WorkflowID(b.tenantA, "ord_fx")
	require.Eventually(t, func() bool { return b.workflowExists(t, wf) }, 10*time.Second, 20*time.Millisecond,
		"the relay module starts the run")

	var metrics string
	require.Eventually(t, func() bool {
		metrics = string(doAt(t, http.DefaultClient, base, "GET", "/metrics", "", "", "").body)
		return strings.Contains(metrics, `keyed_outbox_starts_total{result="started"} 1`) &&
			strings.Contains(metrics, "keyed_outbox_depth 0")
	}, 5*time.Second, 20*time.Millisecond)
	require.Contains(t, metrics, `keyed_api_requests_total{route="POST /v1/orders",status="201"} 1`)
	require.Contains(t, metrics, "keyed_outbox_oldest_unsent_age_seconds 0")

	stopCtx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, app.Stop(stopCtx))
	_, err = http.Get(base + "/healthz")
	require.Error(t, err)

	// No keys: the app refuses to build, naming the variables.
	bad := fx.New(fxapp.Starter(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)),
		fx.Supply(fxapi.Config{Addr: "127.0.0.1:0"}), fxapi.Module))
	require.ErrorContains(t, fxapp.RootCause(bad.Err()), api.EnvKeys)
}
