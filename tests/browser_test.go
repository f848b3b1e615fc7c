package tests

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/internal/devserver"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
)

// An operator works a waiting order in the Temporal Web UI (2.42.1, the dev
// server's), in headless Chromium: finds the order by OrderID, lists what
// needs attention with the documented query, opens the run and sees its
// static summary (tenant, order, amount), its current details (each step's
// state, effect key and outcome, and what to decide) and each activity's
// summary with its effect key. Then the operator sends the decide update
// from the UI itself (More Actions → Send an Update), and the run completes
// in the same run with the one receipt SendGrid holds. Last, a refund of the
// order whose email answer is lost waits the same way, and the operator
// finds it beside the order run (refundWaitsInWebUI).
func TestBrowserOperatorDecidesWaitingOrderInWebUI(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	opts := devserver.ForTests()
	opts.UIPort = 0 // With the Web UI; the package's server is headless.
	srv, err := devserver.Start(ctx, opts)
	require.NoError(t, err, "start a dev server with its Web UI")
	t.Cleanup(func() { _ = srv.Stop() })

	b := setup(t)
	b.temporal, err = client.Dial(client.Options{HostPort: srv.Address(), Logger: quietSDK()})
	require.NoError(t, err)
	t.Cleanup(b.temporal.Close)
	b.deps = b.newDeps(t, lookupOutageOpts)
	b.startRefundWorker(t, lookupOutageOpts) // Orders and refunds, on one task queue.
	b.mail.SetLookupOutage(true)
	w := b.waitingReceipt(t, "web1", fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
	b.awaitAttention(t, w.st.WorkflowID)
	chargeKey, err := orders.NewOrderInput(b.tenant, w.id).EffectKey(orders.StepCharge)
	require.NoError(t, err)

	br := newBrowser(t, srv.UIAddress())
	br.openQuery(`OrderID = "` + w.id + `"`)
	br.waitText(30*time.Second, w.st.WorkflowID, "Running")
	br.openQuery(pipeline.AttentionQuery)
	br.waitText(30*time.Second, w.st.WorkflowID)

	run := "/namespaces/default/workflows/" + url.PathEscape(w.st.WorkflowID) + "/" + w.st.RunID
	br.open(run + "/history")
	br.waitText(30*time.Second, "receipt · effect "+w.key.String()) // The timeline shows activity summaries.
	br.click(10*time.Second, "User Metadata")
	br.waitText(30*time.Second,
		"tenant "+b.tenant+" · order web1 · 15.00 EUR", // Summary: the static summary.
		"charge · effect "+chargeKey.String(),          // Events with Metadata: activity summaries.
		"receipt · effect "+w.key.String(),
		"receipt waiting", "Needs a decision", "receipt:ambiguous", // Current Details,
		`"wait":"`+w.key.String()+`#1"`) // with the exact JSON to paste.

	// A payload missing its fields gets every problem at once.
	br.click(10*time.Second, "More Actions")
	br.click(10*time.Second, "Send an Update")
	const modal = "dialog[open][data-testid=update-confirmation-modal]" // The page holds a closed copy too.
	br.selectUpdate(modal, pipeline.UpdateDecide)
	br.insertText(10*time.Second, modal+" .cm-content", `{"step":"receipt","resolution":"done"}`)
	br.click(10*time.Second, "Submit")
	br.waitText(30*time.Second, "reason is required", "by (who decides) is required", "result is required")
	br.open(run + "/history")

	// The operator finds the message at SendGrid and decides from the UI.
	b.mail.SetLookupOutage(false)
	msgs := b.mail.MessagesFor("effect_key", w.key.String())
	require.Len(t, msgs, 1)
	decision, err := json.Marshal(pipeline.Decision{Step: "receipt", Resolution: "done", By: "ada (web UI)",
		Reason: "found in SendGrid by custom_args", Result: json.RawMessage(`{"message_id":"` + msgs[0].MessageID + `"}`)})
	require.NoError(t, err)
	br.click(10*time.Second, "More Actions")
	br.click(10*time.Second, "Send an Update")
	br.selectUpdate(modal, pipeline.UpdateDecide)
	br.insertText(10*time.Second, modal+" .cm-content", string(decision))
	br.click(10*time.Second, "Submit")

	res, err := b.wait(t, w.st)
	require.NoError(t, err, "the run completes after the UI's update")
	require.Equal(t, msgs[0].MessageID, res.Receipt.MessageID)
	require.Equal(t, 1, b.mail.Count(), "one receipt")
	require.Equal(t, 1, b.stripe.Charges())
	require.Equal(t, 1, b.runs(t, w.st.WorkflowID), "in the same run")
	br.open(run + "/history")
	br.waitText(30*time.Second, "Completed")
	br.click(10*time.Second, "User Metadata")
	br.waitText(30*time.Second, "receipt done", msgs[0].MessageID)

	b.refundWaitsInWebUI(t, br, w.id)
}

// refundWaitsInWebUI refunds part of the paid order id with SendGrid losing
// the refund email's answer: the refund run waits, and the operator finds
// it beside the order run by OrderID and in the attention list, and reads
// in its details what to decide. The decision, sent with SendDecision,
// completes it with one Stripe refund and one refund email.
func (b *bundle) refundWaitsInWebUI(t *testing.T, br *browser, id string) {
	t.Helper()
	in := refunds.NewInput(b.tenant, id, "r1", 500, "damaged")
	emailKey, err := in.EffectKey(refunds.StepEmail)
	require.NoError(t, err)
	b.mail.SetLookupOutage(true)
	b.mail.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse, Match: emailKey.String()})
	run, err := startRefund(b.ctx, b.temporal, in, b.taskQueue)
	require.NoError(t, err)
	b.awaitAttention(t, in.WorkflowID())

	br.openQuery(`OrderID = "` + id + `"`)
	br.waitText(30*time.Second, in.WorkflowID(), orders.NewOrderInput(b.tenant, id).WorkflowID())
	br.openQuery(pipeline.AttentionQuery)
	br.waitText(30*time.Second, in.WorkflowID())
	br.open("/namespaces/default/workflows/" + url.PathEscape(in.WorkflowID()) + "/" + run.GetRunID() + "/history")
	br.click(10*time.Second, "User Metadata")
	br.waitText(30*time.Second, "refund r1 of order "+id, "refund_stripe done", "refund_email waiting",
		"Needs a decision", "refund_email:ambiguous")

	b.mail.SetLookupOutage(false)
	msgs := b.mail.MessagesFor("effect_key", emailKey.String())
	require.Len(t, msgs, 1)
	_, err = pipeline.SendDecision(b.ctx, b.temporal, in.WorkflowID(), "", pipeline.Decision{Step: refunds.StepEmail,
		Resolution: "done", By: "ada", Reason: "found in SendGrid", Result: json.RawMessage(`{"message_id":"` + msgs[0].MessageID + `"}`)})
	require.NoError(t, err)
	var res refunds.Result
	require.NoError(t, run.Get(b.ctx, &res), "the refund run completes after the decision")
	require.Equal(t, msgs[0].MessageID, res.Email.MessageID)
	require.Equal(t, 1, b.stripe.Refunds(), "one Stripe refund")
	require.Equal(t, 2, b.mail.Count(), "the receipt and one refund email")
}
