package tests

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/worker"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/outbox"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
	orderflow "github.com/keyedhq/keyed/workflows/order"
)

// A receipt keyed cannot know about waits for a person instead of failing:
// SendGrid takes one receipt and loses the answer, refuses another after
// the client gave up, and its Email Activity API is down for longer than
// keyed waits. Both runs wait with KeyedAttention set and are found by the
// documented query; the operator, with the provider answering again, decides
// "done" for the first (the message is at SendGrid; through the SDK) and
// "retry" for the second (it is not; through the CLI). Both complete in the
// same run, with one receipt each.
func TestUnknownReceiptWaitsForDecisionInTheSameRun(t *testing.T) {
	t.Parallel()
	b := setupLookupOutage(t)

	sent := b.waitingReceipt(t, "sent1", fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
	lost := b.waitingReceipt(t, "lost1", fakesendgrid.Fault{Kind: fakesendgrid.FaultServerError, Delay: 3 * time.Second})
	for _, w := range []*waitingOrder{sent, lost} {
		a := b.awaitAttention(t, w.st.WorkflowID)
		require.Equal(t, "receipt:ambiguous", a.Attention)
		require.Equal(t, w.st.RunID, a.RunID)
		require.Equal(t, b.tenant, a.TenantID)
		value, runID, err := pipeline.AttentionOf(b.ctx, b.temporal, w.st.WorkflowID)
		require.NoError(t, err)
		require.Equal(t, "receipt:ambiguous", value)
		require.Equal(t, w.st.RunID, runID)
	}
	require.Len(t, b.mail.MessagesFor("effect_key", sent.key.String()), 1, "SendGrid took the first receipt")
	require.Empty(t, b.mail.MessagesFor("effect_key", lost.key.String()), "and refused the second")

	// A decision the validator refuses changes nothing.
	_, err := pipeline.SendDecision(b.ctx, b.temporal, sent.st.WorkflowID, "", pipeline.Decision{Step: "charge", Resolution: "done", By: "ada", Reason: "x"})
	require.ErrorContains(t, err, `step "charge" is not waiting`)

	// The operator looks both keys up at SendGrid, answering again.
	b.mail.SetLookupOutage(false)
	msg := b.mail.MessagesFor("effect_key", sent.key.String())[0]
	result, err := json.Marshal(orders.ReceiptResult{MessageID: msg.MessageID})
	require.NoError(t, err)
	res, err := pipeline.SendDecision(b.ctx, b.temporal, sent.st.WorkflowID, "", pipeline.Decision{Step: "receipt",
		Resolution: effects.ResolveDone, Result: result, By: "ada", Reason: "found in SendGrid by custom_args"})
	require.NoError(t, err)
	require.Equal(t, string(effects.StateSucceeded), res.State)
	// The second decision goes through the CLI, as docs/operating.md shows.
	bin, err := devserver.FindBinary()
	require.NoError(t, err)
	out, err := exec.CommandContext(b.ctx, bin, "workflow", "update", "execute", "--address", temporalAddr,
		"--workflow-id", lost.st.WorkflowID, "--name", pipeline.UpdateDecide,
		"--input", `{"step":"receipt","resolution":"retry","by":"ada","reason":"not in SendGrid's activity feed"}`).CombinedOutput()
	require.NoError(t, err, "temporal workflow update execute:\n%s", out)

	for _, w := range []*waitingOrder{sent, lost} {
		out, err := b.wait(t, w.st)
		require.NoError(t, err, w.id)
		require.NotEmpty(t, out.Receipt.MessageID)
		require.Len(t, b.mail.MessagesFor("effect_key", w.key.String()), 1, "one receipt for %s", w.id)
		require.Equal(t, 1, b.runs(t, w.st.WorkflowID), "the same run went on")
		rec := b.records(t, w.id)[orders.StepReceipt]
		require.Equal(t, effects.StateSucceeded, rec.State)
	}
	final, err := b.wait(t, sent.st)
	require.NoError(t, err)
	require.Equal(t, msg.MessageID, final.Receipt.MessageID, "the decided outcome is the run's")
	require.Contains(t, b.records(t, sent.id)[orders.StepReceipt].ErrorMessage, "ada decided done", "the record says who and why")
	require.Equal(t, 2, b.stripe.Charges())
	require.Equal(t, 2, b.mail.Count())
	require.Eventually(t, func() bool { return !b.listed(t, sent.st.WorkflowID) && !b.listed(t, lost.st.WorkflowID) },
		10*time.Second, 200*time.Millisecond, "KeyedAttention is cleared when the run goes on")
}

// lookupOutageOpts makes a lost receipt ambiguous within seconds, as
// tests/operator_test.go does: a short HTTP timeout and look-up bound.
func lookupOutageOpts(o *notify.SenderOpts) {
	o.HTTPClient = &http.Client{Timeout: 2 * time.Second}
	o.LookupLag, o.LookupGiveUp, o.CollapseWindow = time.Second, time.Second, time.Minute
}

// setupLookupOutage returns a bundle whose worker runs every pipeline with
// ApplyDecision and whose SendGrid look-up is down, so that a receipt whose
// answer is lost waits for a decision within seconds (lookupOutageOpts).
func setupLookupOutage(t testing.TB) *bundle {
	t.Helper()
	b := setup(t)
	b.deps = b.newDeps(t, lookupOutageOpts)
	b.startDecidingWorker(t)
	b.mail.SetLookupOutage(true)
	return b
}

// startDecidingWorker runs a worker with the order activities and
// ApplyDecision, as every production worker must.
func (b *bundle) startDecidingWorker(t testing.TB) worker.Worker {
	t.Helper()
	w := worker.New(b.temporal, b.taskQueue, worker.Options{})
	require.NoError(t, pipeline.Register(w, workflows.Pipelines(), b.deps, nil))
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	return w
}

// waitingOrder is an order run started to wait on its receipt.
type waitingOrder struct {
	id  string
	key effects.Key
	st  *outbox.Started
}

// waitingReceipt creates order id, queues fault for its receipt and starts
// its run.
func (b *bundle) waitingReceipt(t testing.TB, id string, fault fakesendgrid.Fault) *waitingOrder {
	t.Helper()
	o := b.order(t, id, 1500, "pm_card_visa")
	in := orders.NewOrderInput(b.tenant, id)
	key, err := in.EffectKey(orders.StepReceipt)
	require.NoError(t, err)
	fault.Match = key.String()
	b.mail.Inject(fault)
	st, err := orderflow.Start(b.ctx, b.temporal, in, &orderflow.StartOpts{TaskQueue: b.taskQueue, Order: o})
	require.NoError(t, err)
	return &waitingOrder{id: id, key: key, st: st}
}

// awaitAttention waits until ListAttention lists the run of workflowID.
func (b *bundle) awaitAttention(t *testing.T, workflowID string) pipeline.Attention {
	t.Helper()
	var found pipeline.Attention
	require.Eventually(t, func() bool {
		list, err := pipeline.ListAttention(b.ctx, b.temporal)
		require.NoError(t, err)
		i := slices.IndexFunc(list, func(a pipeline.Attention) bool { return a.WorkflowID == workflowID })
		if i >= 0 {
			found = list[i]
		}
		return i >= 0
	}, 90*time.Second, 250*time.Millisecond, "%s is listed by %s", workflowID, pipeline.AttentionQuery)
	return found
}

// listed reports whether ListAttention lists workflowID.
func (b *bundle) listed(t *testing.T, workflowID string) bool {
	t.Helper()
	list, err := pipeline.ListAttention(b.ctx, b.temporal)
	require.NoError(t, err)
	return slices.ContainsFunc(list, func(a pipeline.Attention) bool { return a.WorkflowID == workflowID })
}
