package order_test

import (
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// survey declares a step added after the receipt, for the tests of adding
// a step to a workflow with runs in flight.
var survey = step.Declaration{Name: "SendSurvey", Class: effects.ClassIrreversibleSend, Step: "survey", Policy: notify.AtMostOnce}

func replay(r worker.WorkflowReplayer, file string) error {
	return r.ReplayWorkflowHistoryFromJSONFile(log.NewStructuredLogger(slog.New(slog.DiscardHandler)), file)
}

// TestReplayCatchesAStepAddedWithoutGetVersion replays a finished run
// recorded before a step was added after the receipt: added bare, the
// replay schedules an activity the history does not have and fails; added
// behind workflow.GetVersion (as docs/adding-an-activity.md says),
// it replays.
func TestReplayCatchesAStepAddedWithoutGetVersion(t *testing.T) {
	t.Parallel()
	bare := worker.NewWorkflowReplayer()
	orderflow.RegisterWithStepAfterReceipt(bare, survey, "")
	require.ErrorContains(t, replay(bare, "testdata/order_happy.json"), "nondeterministic")

	versioned := worker.NewWorkflowReplayer()
	orderflow.RegisterWithStepAfterReceipt(versioned, survey, "send-survey")
	require.NoError(t, replay(versioned, "testdata/order_happy.json"))
}

// TestReplay replays histories recorded on a Temporal dev server with the
// real activities against the fake Stripe and SendGrid: a change to
// OrderWorkflow that would break runs in flight (a step added, removed or
// reordered without workflow.GetVersion) fails here. To record a new one,
// run the workflow on bin/temporal and save
// `bin/temporal workflow show --workflow-id ID --output json`, or run
// tests' TestHappyPath with KEYED_RECORD_HISTORY set to the file.
func TestReplay(t *testing.T) {
	t.Parallel()
	// order_declined.json predates marking a declined order failed and
	// replays without it (workflow.DefaultVersion of the change
	// "mark-failed-on-decline"); order_declined_v1.json runs MarkFailed.
	// order_receipt_decided_v1.json waits on an ambiguous receipt
	// (version 1 of "wait-for-decision"), takes a "done" decide update,
	// runs ApplyDecision and the receipt again, and completes.
	// order_happy_v1.json runs MarkPaid as a local activity (version 1 of
	// "local-database-steps"); the older ones run it as an activity.
	// order_happy_v2.json was started with pipeline.MemoLocalSteps and runs
	// it as a local activity with no version marker. order_happy_v3.json was
	// also started with pipeline.MemoLocalFirst and runs all three steps in
	// its first workflow task; in order_charge_lost_v3.json the charge's
	// first attempt there lost Stripe's answer and the charge ran again as
	// an activity.
	for _, file := range []string{"testdata/order_happy.json", "testdata/order_declined.json", "testdata/order_declined_v1.json",
		"testdata/order_receipt_decided_v1.json", "testdata/order_happy_v1.json", "testdata/order_happy_v2.json",
		"testdata/order_happy_v3.json", "testdata/order_charge_lost_v3.json"} {
		r := worker.NewWorkflowReplayer()
		orderflow.Register(r, nil)
		require.NoError(t, replay(r, file), file)
	}
}

// TestReplayMarkerAndMemo replays a run started with pipeline.MemoLocalSteps
// that a worker from before the memo ran: it recorded the version marker
// of "local-database-steps" and its search attribute upsert, which this
// code, reading the memo, does not ask for.
func TestReplayMarkerAndMemo(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("testdata/order_happy_v1.json")
	require.NoError(t, err)
	var h historypb.History
	require.NoError(t, protojson.Unmarshal(raw, &h))
	memo, err := converter.GetDefaultDataConverter().ToPayload(true)
	require.NoError(t, err)
	h.Events[0].GetWorkflowExecutionStartedEventAttributes().Memo = &commonpb.Memo{
		Fields: map[string]*commonpb.Payload{pipeline.MemoLocalSteps: memo}}
	r := worker.NewWorkflowReplayer()
	orderflow.Register(r, nil)
	require.NoError(t, r.ReplayWorkflowHistory(log.NewStructuredLogger(slog.New(slog.DiscardHandler)), &h))
}
