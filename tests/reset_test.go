package tests

import (
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"

	ordersteps "github.com/keyedhq/keyed/activities/order"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fakestripe"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
)

// The Web UI's Reset button re-runs everything after the reset point,
// completed side effects included. For a keyed order that is safe: every
// step re-enters its effect key and gets the stored outcome. The test
// resets a completed run with the CLI (`temporal workflow reset`) to its
// first workflow task and, separately, to the workflow task after the
// charge, lets each new run finish, and counts at the fakes: still one
// charge and one receipt, and the same result.
func TestResetCompletedOrderRunMakesNoSecondEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startDecidingWorker(t)
	b.order(t, "reset1", 2500, "pm_card_visa")
	in := orders.NewOrderInput(b.tenant, "reset1")
	// Stripe's 500 fails the charge's first attempt, in the workflow task,
	// so that the charge then runs as an activity and the run has a
	// workflow task after it to reset to.
	b.stripe.Inject(fakestripe.Fault{Kind: fakestripe.FaultServerError})
	first := b.start(t, in)
	want, err := b.wait(t, first)
	require.NoError(t, err)

	afterCharge := b.taskAfterActivity(t, first, ordersteps.NameCharge)
	for name, point := range map[string][]string{
		"first workflow task":   {"--type", "FirstWorkflowTask"},
		"task after the charge": {"--event-id", strconv.FormatInt(afterCharge, 10)},
	} {
		b.reset(t, first, point...)
		got, err := b.wait(t, &outbox.Started{WorkflowID: first.WorkflowID})
		require.NoError(t, err, name)
		require.Equal(t, want, got, "%s: the same outcome", name)
		require.Equal(t, 1, b.stripe.Charges(), "%s: no second charge", name)
		require.Equal(t, 1, b.mail.Count(), "%s: no second receipt", name)
	}
	require.Equal(t, 3, b.runs(t, first.WorkflowID), "the completed run and one run per reset")
	o, err := b.orders.Get(b.ctx, b.tenant, "reset1")
	require.NoError(t, err)
	require.Equal(t, orders.StatusPaid, o.Status)
}

// reset runs `temporal workflow reset` on run st with the reset point args,
// waits until the new run is the workflow's current one and returns its ID.
func (b *bundle) reset(t *testing.T, st *outbox.Started, point ...string) string {
	t.Helper()
	bin, err := devserver.FindBinary()
	require.NoError(t, err)
	before, err := b.temporal.DescribeWorkflow(b.ctx, st.WorkflowID, "")
	require.NoError(t, err)
	args := append([]string{"workflow", "reset", "--address", temporalAddr, "--namespace", "default",
		"--workflow-id", st.WorkflowID, "--run-id", st.RunID, "--reason", "reset test"}, point...)
	out, err := exec.CommandContext(b.ctx, bin, args...).CombinedOutput()
	require.NoError(t, err, "temporal %v:\n%s", args, out)
	var runID string
	require.Eventually(t, func() bool {
		d, err := b.temporal.DescribeWorkflow(b.ctx, st.WorkflowID, "")
		require.NoError(t, err)
		runID = d.RawResponse.GetWorkflowExecutionInfo().GetExecution().GetRunId()
		return runID != before.RawResponse.GetWorkflowExecutionInfo().GetExecution().GetRunId()
	}, 10*time.Second, 100*time.Millisecond, "a new run after the reset")
	return runID
}

// taskAfterActivity returns the ID of the first WorkflowTaskCompleted event
// after activity name completed in run st.
func (b *bundle) taskAfterActivity(t *testing.T, st *outbox.Started, name string) int64 {
	t.Helper()
	scheduled := map[int64]string{}
	completed := false
	for _, e := range b.history(t, st) {
		switch e.GetEventType() {
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			scheduled[e.GetEventId()] = e.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName()
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
			completed = completed || activityOf(e, scheduled) == name
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
			if completed {
				return e.GetEventId()
			}
		}
	}
	require.Failf(t, "no workflow task after the activity", "%s in %s", name, st.WorkflowID)
	return 0
}

func activityOf(e *historypb.HistoryEvent, scheduled map[int64]string) string {
	return scheduled[e.GetActivityTaskCompletedEventAttributes().GetScheduledEventId()]
}
