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
)

// An operator works a waiting order in the Temporal Web UI (2.42.1, the dev
// server's), in headless Chromium: finds the order by OrderID, lists what
// needs attention with the documented query, opens the run and sees its
// static summary (tenant, order, amount), its current details (each step's
// state, effect key and outcome, and what to decide) and each activity's
// summary with its effect key. Then the operator sends the decide update
// from the UI itself (More Actions → Send an Update), and the run completes
// in the same run with the one receipt SendGrid holds.
func TestBrowserOperatorDecidesWaitingOrderInWebUI(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	srv, err := devserver.Start(ctx, &devserver.Opts{}) // With the Web UI; the package's server is headless.
	require.NoError(t, err, "start a dev server with its Web UI")
	t.Cleanup(func() { _ = srv.Stop() })

	b := setup(t)
	b.temporal, err = client.Dial(client.Options{HostPort: srv.Address(), Logger: quietSDK()})
	require.NoError(t, err)
	t.Cleanup(b.temporal.Close)
	b.acts = b.newActivities(t, lookupOutageOpts)
	b.startDecidingWorker(t)
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
		"receipt waiting", "Needs a decision", "receipt:ambiguous") // Current Details.

	// The operator finds the message at SendGrid and decides from the UI.
	b.mail.SetLookupOutage(false)
	msgs := b.mail.MessagesFor("effect_key", w.key.String())
	require.Len(t, msgs, 1)
	decision, err := json.Marshal(pipeline.Decision{Step: "receipt", Resolution: "done", By: "ada (web UI)",
		Reason: "found in SendGrid by custom_args", Result: json.RawMessage(`{"message_id":"` + msgs[0].MessageID + `"}`)})
	require.NoError(t, err)
	br.click(10*time.Second, "More Actions")
	br.click(10*time.Second, "Send an Update")
	const modal = "dialog[open][data-testid=update-confirmation-modal]" // The page holds a closed copy too.
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
}
