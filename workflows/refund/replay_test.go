package refund_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	refundflow "github.com/keyedhq/keyed/workflows/refund"
)

// TestReplay replays refund histories recorded on a Temporal dev server
// with the real activities against the fake Stripe and SendGrid, as
// workflows' TestReplay does for orders. refund_happy.json and
// refund_email_ambiguous_failed.json were recorded before RefundWorkflow
// ran its steps through pipeline.Run: the second failed on an ambiguous
// refund email and replays so (workflow.DefaultVersion of the change
// "wait-for-decision"). refund_email_decided_v1.json waits on an ambiguous
// refund email, takes a "done" decide update, runs ApplyDecision and the
// email again, and completes. refund_happy_v3.json was started with
// pipeline.MemoLocalFirst and ran every step in its first workflow task.
func TestReplay(t *testing.T) {
	t.Parallel()
	for _, file := range []string{"testdata/refund_happy.json", "testdata/refund_email_ambiguous_failed.json",
		"testdata/refund_email_decided_v1.json", "testdata/refund_happy_v3.json"} {
		r := worker.NewWorkflowReplayer()
		refundflow.Register(r, nil)
		require.NoError(t, r.ReplayWorkflowHistoryFromJSONFile(log.NewStructuredLogger(slog.New(slog.DiscardHandler)), file), file)
	}
}
