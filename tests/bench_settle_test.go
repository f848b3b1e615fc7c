package tests

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/fakesendgrid"
)

// BenchmarkSettleAfterLookupOutage measures the settler: N receipts
// (KEYED_BENCH_WAITS, 20) lose their answers while SendGrid's Email
// Activity is down for KEYED_BENCH_OUTAGE (1m); half went out, half did
// not. A settler pass runs every KEYED_BENCH_SETTLE_EVERY (10s), as the
// worker's schedule does. It reports the waits, those settled by keyed,
// those left for a person, wrong decisions during the outage, duplicate and
// missing receipts counted at the fake SendGrid, and the time from the
// recovery to each run's completion (p50, p99).
func BenchmarkSettleAfterLookupOutage(b *testing.B) {
	waits, outage, every := envInt("KEYED_BENCH_WAITS", 20), envDuration("KEYED_BENCH_OUTAGE", time.Minute), envDuration("KEYED_BENCH_SETTLE_EVERY", 10*time.Second)
	for range b.N {
		w := setup(b)
		ctx, cancel := context.WithTimeout(context.Background(), outage+15*time.Minute)
		w.ctx = ctx
		w.deps = w.newDeps(b, lookupOutageOpts)
		w.startDecidingWorker(b)
		w.mail.SetLookupOutage(true)
		began := time.Now()
		var runs []*waitingOrder
		for i := range waits {
			fault := fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse}
			if i%2 == 1 {
				fault = fakesendgrid.Fault{Kind: fakesendgrid.FaultServerError, Delay: 3 * time.Second}
			}
			runs = append(runs, w.waitingReceipt(b, fmt.Sprintf("bench%d", i), fault))
		}
		s := w.newSettler(b)
		wrong := 0
		for time.Since(began) < outage { // The schedule passes during the outage: nothing is definitive.
			verdicts, err := s.Pass(w.ctx)
			require.NoError(b, err)
			for _, v := range verdicts {
				if v.Applied {
					wrong++
				}
			}
			time.Sleep(every)
		}
		w.mail.SetLookupOutage(false)
		recovered := time.Now()
		settled := 0
		for settled < waits && time.Since(recovered) < 10*time.Minute {
			verdicts, err := s.Pass(w.ctx)
			require.NoError(b, err)
			for _, v := range verdicts {
				if v.Applied {
					settled++
				}
			}
			if settled < waits {
				time.Sleep(every)
			}
		}
		var took []time.Duration
		for _, r := range runs {
			err := w.temporal.GetWorkflow(w.ctx, r.st.WorkflowID, r.st.RunID).Get(w.ctx, nil)
			require.NoError(b, err, r.id)
			took = append(took, time.Since(recovered))
		}
		slices.Sort(took)
		extra := 0
		for _, r := range runs {
			extra += max(len(w.mail.MessagesFor("effect_key", r.key.String()))-1, 1-len(w.mail.MessagesFor("effect_key", r.key.String())))
		}
		cancel()
		b.ReportMetric(float64(waits), "waits")
		b.ReportMetric(float64(settled), "settled-by-keyed")
		b.ReportMetric(float64(waits-settled), "left-for-person")
		b.ReportMetric(float64(wrong), "decided-during-outage")
		b.ReportMetric(float64(extra), "duplicate-or-missing-receipts")
		b.ReportMetric(took[len(took)/2].Seconds(), "recovery-to-done-p50-s")
		b.ReportMetric(took[len(took)*99/100].Seconds(), "recovery-to-done-p99-s")
	}
}

// envDuration returns the duration in the environment variable name, or def.
func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}
