package tests

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/notify"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/refunds"
)

// A refund email keyed cannot know about waits for a person instead of
// failing the refund: SendGrid takes the email and loses the answer, and
// its Email Activity API is down for longer than keyed waits, so the email
// step ends ambiguous. The refund run waits with KeyedAttention
// "refund_email:ambiguous" and is listed with the order runs; the operator,
// with SendGrid answering again, finds the message and decides "done". The
// run completes in the same run with that message as its outcome: one
// Stripe refund, one refund email.
func TestAmbiguousRefundEmailWaitsForDecisionInTheSameRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := refunds.NewInput(b.tenant, "o1", "r1", 500, "damaged")
	run, emailKey := b.startRefundWithLostEmail(t, in)

	a := b.awaitAttention(t, in.WorkflowID())
	require.Equal(t, "refund_email:ambiguous", a.Attention)
	require.Equal(t, refunds.WorkflowName, a.WorkflowType)
	require.Equal(t, run.GetRunID(), a.RunID)
	value, runID, err := pipeline.AttentionOf(b.ctx, b.temporal, in.WorkflowID())
	require.NoError(t, err)
	require.Equal(t, "refund_email:ambiguous", value)
	require.Equal(t, run.GetRunID(), runID)
	require.Equal(t, 1, b.stripe.Refunds(), "the money went back before the email")
	msgs := b.mail.MessagesFor(notify.CustomArgEffectKey, emailKey.String())
	require.Len(t, msgs, 1, "SendGrid took the email")

	// The operator looks the key up at SendGrid, answering again.
	b.mail.SetLookupOutage(false)
	result, err := json.Marshal(refunds.EmailResult{MessageID: msgs[0].MessageID})
	require.NoError(t, err)
	res, err := pipeline.SendDecision(b.ctx, b.temporal, in.WorkflowID(), "", pipeline.Decision{Step: refunds.StepEmail,
		Resolution: effects.ResolveDone, Result: result, By: "ada", Reason: "found in SendGrid by custom_args"})
	require.NoError(t, err)
	require.Equal(t, string(effects.StateSucceeded), res.State)

	var out refunds.Result
	require.NoError(t, run.Get(b.ctx, &out), "the refund completes instead of failing")
	require.Equal(t, msgs[0].MessageID, out.Email.MessageID, "the decided outcome is the run's")
	require.Equal(t, 1, b.runs(t, in.WorkflowID()), "the same run went on")
	require.Equal(t, 1, b.stripe.Refunds())
	require.Len(t, b.mail.MessagesFor(notify.CustomArgEffectKey, emailKey.String()), 1, "one refund email")
	rec, err := b.effects.Get(b.ctx, emailKey)
	require.NoError(t, err)
	require.Equal(t, effects.StateSucceeded, rec.State)
	require.Contains(t, rec.ErrorMessage, "ada decided done", "the record says who and why")
	require.Eventually(t, func() bool { return !b.listed(t, in.WorkflowID()) }, 10*time.Second, 200*time.Millisecond,
		"KeyedAttention is cleared when the run goes on")
}

// A refund run that waits is listed by `starter attention` with the order
// runs, and `starter resolve` on the refund step's effect key sends it the
// decision (the key names the refund's run): the ambiguous refund email is
// decided "retry", and the retry looks the key up at SendGrid, answering
// again, finds the email and sends nothing twice.
func TestStarterResolveDecidesAWaitingRefund(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := refunds.NewInput(b.tenant, "o1", "r1", 1999, "")
	run, emailKey := b.startRefundWithLostEmail(t, in)
	b.awaitAttention(t, in.WorkflowID())

	starter := b.starterCLI(t)
	var listed []pipeline.Attention
	decodeJSON(t, starter("attention", "--json"), &listed)
	i := indexOf(listed, in.WorkflowID())
	require.Equal(t, in.WorkflowID(), listed[i].WorkflowID)
	require.Equal(t, "refund_email:ambiguous", listed[i].Attention)
	require.Equal(t, refunds.WorkflowName, listed[i].WorkflowType)
	require.Contains(t, starter("attention"), in.WorkflowID())

	b.mail.SetLookupOutage(false)
	got := starter("resolve", "--key", emailKey.String(), "--as", "retry", "--by", "ada", "--reason", "SendGrid answers again")
	require.Contains(t, got, emailKey.String()+" decided retry in the waiting run")

	var out refunds.Result
	require.NoError(t, run.Get(b.ctx, &out))
	msgs := b.mail.MessagesFor(notify.CustomArgEffectKey, emailKey.String())
	require.Len(t, msgs, 1, "the retry found the email at SendGrid; nothing sent twice")
	require.Equal(t, msgs[0].MessageID, out.Email.MessageID)
	require.Equal(t, 1, b.stripe.Refunds())
	require.Equal(t, 1, b.runs(t, in.WorkflowID()), "the same run went on")
}

// startRefundWithLostEmail starts a refund worker, pays order o1 (19.99),
// and starts the refund in with SendGrid losing the refund email's answer
// while its look-up is down, so that the email step ends ambiguous. It
// returns the run and the email step's effect key.
func (b *bundle) startRefundWithLostEmail(t *testing.T, in refunds.RefundInput) (client.WorkflowRun, effects.Key) {
	t.Helper()
	b.startRefundWorker(t, lookupOutageOpts)
	b.paidOrder(t, in.OrderID, 1999)
	emailKey, err := in.EffectKey(refunds.StepEmail)
	require.NoError(t, err)
	b.mail.SetLookupOutage(true)
	b.mail.Inject(fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse, Match: emailKey.String()})
	run, err := startRefund(b.ctx, b.temporal, in, b.taskQueue)
	require.NoError(t, err)
	return run, emailKey
}
