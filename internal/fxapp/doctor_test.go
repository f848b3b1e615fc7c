package fxapp_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/keyedhq/keyed/internal/fxapp"
	"github.com/keyedhq/keyed/internal/fxapp/fxapptest"
	"github.com/keyedhq/keyed/internal/logbuf"
)

// TestWorkerReportsDoctorChecksAtStart starts a worker on a pool below its
// default size, in a deployment that never reconciled, and finds both in
// its log (one line each) and in keyed_doctor_check_status, while the
// checks that pass are exported as 0.
func TestWorkerReportsDoctorChecksAtStart(t *testing.T) {
	t.Parallel()
	var logs logbuf.Buffer
	d := fxapptest.Prepare(t, nil)
	d.Env["DATABASE_URL"] += "&pool_max_conns=6"
	// A deployment that never reconciles, installed long enough ago to have.
	d.Env["RECONCILE_EVERY"] = "0"
	fxapptest.InstalledAgo(t, d, 48*time.Hour)
	w, err := fxapptest.StartOn(t, d, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	require.NoError(t, err)

	var metrics string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := http.Get("http://" + w.Metrics.Addr() + "/metrics")
		if !assert.NoError(c, err) {
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		assert.NoError(c, err)
		metrics = string(body)
		assert.Contains(c, metrics, `keyed_doctor_check_status{check="reconcile",subject="deployment"} 3`)
	}, 30*time.Second, 200*time.Millisecond)
	for _, want := range []string{
		`keyed_doctor_check_status{check="pool",subject="worker"} 1`,
		`keyed_doctor_check_status{check="classified",subject="Charge"} 0`,
		`keyed_doctor_check_status{check="retention",subject="EFFECTS_RETENTION"} 0`,
		`keyed_doctor_check_status{check="search_attributes",subject="KeyedAttention"} 0`,
		`keyed_doctor_check_status{check="lease",subject="SendReceipt"} 0`,
	} {
		require.Contains(t, metrics, want)
	}
	require.NotContains(t, metrics, `check="dead_letters"`, "the start-up report runs the cheap checks only")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Contains(c, logs.String(), "doctor checked the deployment")
	}, 10*time.Second, 100*time.Millisecond)
	out := logs.String()
	require.Contains(t, out, `msg="doctor: pool worker: warn" component=doctor check=pool subject=worker status=warn evidence="pool_max_conns=6: the worker needs at least 4`)
	require.Contains(t, out, `msg="doctor: reconcile deployment: fail"`)
	require.Contains(t, out, "not_passed=2")
	require.NotContains(t, out, "doctor: classified")
}

// TestWorkerRepeatsItsDoctorReport finds the reconcile check failing at
// start and passing once a reconciliation is recorded, in the gauge and
// in one log line.
func TestWorkerRepeatsItsDoctorReport(t *testing.T) {
	t.Parallel()
	var logs logbuf.Buffer
	d := fxapptest.Prepare(t, nil)
	fxapptest.InstalledAgo(t, d, 48*time.Hour)
	w, err := fxapptest.StartOn(t, d, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		fx.Supply(fxapp.DoctorEvery(300*time.Millisecond)))
	require.NoError(t, err)
	gauge := func(c *assert.CollectT, want string) {
		resp, err := http.Get("http://" + w.Metrics.Addr() + "/metrics")
		if !assert.NoError(c, err) {
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		assert.NoError(c, err)
		assert.Contains(c, string(body), `keyed_doctor_check_status{check="reconcile",subject="deployment"} `+want)
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) { gauge(c, "3") }, 30*time.Second, 100*time.Millisecond)
	_, err = w.Pool.Exec(context.Background(), `INSERT INTO keyed_reconcile_runs (window_from, window_to, records, payment_intents, in_flight, findings)
VALUES (now() - interval '25 hours', now(), 0, 0, 0, 0)`)
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) { gauge(c, "0") }, 30*time.Second, 100*time.Millisecond)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Contains(c, logs.String(), `level=INFO msg="doctor: reconcile deployment: pass"`)
	}, 10*time.Second, 100*time.Millisecond)
	require.Equal(t, 1, strings.Count(logs.String(), `msg="doctor: reconcile deployment: fail"`), "a status is logged when it changes")
}
