// Package tests holds keyed's end-to-end tests: a real Temporal dev server,
// a real Postgres, and fakes standing in for Stripe and SendGrid only.
package tests

import (
	"os"
	"testing"

	"github.com/keyedhq/keyed/internal/devserver"
)

// temporalAddr is the dev server shared by every test in the package. Tests
// stay apart by using their own tenant (so their own workflow IDs), their
// own task queue and their own Postgres schema.
var temporalAddr string

// temporalPID is the shared dev server's process ID, for the benchmarks'
// CPU accounting.
var temporalPID int

// temporalMetrics is the URL of the shared dev server's metrics, for the
// benchmarks' count of its calls per run.
var temporalMetrics string

func TestMain(m *testing.M) {
	if q := os.Getenv(envBareWorker); q != "" {
		os.Exit(runBareWorker(q))
	}
	os.Exit(devserver.RunTests(m, "end-to-end", func(s *devserver.Server) {
		temporalAddr, temporalPID, temporalMetrics = s.Address(), s.PID(), s.MetricsAddress()
	}))
}
