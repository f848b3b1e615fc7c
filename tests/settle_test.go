package tests

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/workflows"
)

// newSettler returns a Settler over every pipeline's steps bound to b's
// providers, settling the runs of b's task queue only.
func (b *bundle) newSettler(t testing.TB) *pipeline.Settler {
	t.Helper()
	defs, err := pipeline.Definitions(workflows.Pipelines(), b.deps)
	require.NoError(t, err)
	s, err := pipeline.NewSettler(b.temporal, defs, &pipeline.SettlerOpts{Logger: quiet(), Query: "TaskQueue = '" + b.taskQueue + "'"})
	require.NoError(t, err)
	return s
}

// Receipts whose answers were lost while SendGrid's Email Activity was
// down wait for a decision; while the look-up fails, the settler decides
// nothing. Once it answers again, one settler pass decides every wait from
// the evidence: "done" with the message ID SendGrid shows for the receipts
// that went out, "retry" for those that did not. Every run completes in the
// same run with exactly one receipt at SendGrid, and no person decided.
func TestSettlerDecidesWaitsFromProviderEvidence(t *testing.T) {
	t.Parallel()
	b := setupLookupOutage(t)
	var waits []*waitingOrder
	for i := range 6 {
		fault := fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse} // Sent; the answer is lost.
		if i%2 == 1 {
			fault = fakesendgrid.Fault{Kind: fakesendgrid.FaultServerError, Delay: 3 * time.Second} // Not sent.
		}
		waits = append(waits, b.waitingReceipt(t, fmt.Sprintf("settle%d", i), fault))
	}
	for _, w := range waits {
		require.Equal(t, "receipt:ambiguous", b.awaitAttention(t, w.st.WorkflowID).Attention)
	}
	s := b.newSettler(t)

	verdicts, err := s.Pass(b.ctx)
	require.NoError(t, err)
	require.Len(t, verdicts, len(waits))
	for _, v := range verdicts {
		require.Empty(t, v.Resolution, "the look-up is down: %s", v.Evidence)
		require.False(t, v.Applied)
		require.Contains(t, v.Evidence, "not definitive")
	}

	b.mail.SetLookupOutage(false)
	recovered := time.Now()
	decided := map[string]effects.Resolution{}
	passes := 0
	require.Eventually(t, func() bool { // The worker's schedule passes once per SETTLE_EVERY.
		passes++
		verdicts, err := s.Pass(b.ctx)
		require.NoError(t, err)
		for _, v := range verdicts {
			if v.Applied {
				decided[v.WorkflowID] = v.Resolution
			} else {
				require.Empty(t, v.Resolution, "a definitive verdict is applied: %s", v.Error)
			}
		}
		return len(decided) == len(waits)
	}, 60*time.Second, time.Second)
	var settled []time.Duration
	for i, w := range waits {
		want := effects.ResolveDone
		if i%2 == 1 {
			want = effects.ResolveRetry
		}
		require.Equal(t, want, decided[w.st.WorkflowID], w.id)
	}
	for _, w := range waits {
		out, err := b.wait(t, w.st)
		require.NoError(t, err, w.id)
		settled = append(settled, time.Since(recovered))
		require.Len(t, b.mail.MessagesFor("effect_key", w.key.String()), 1, "one receipt for %s", w.id)
		require.Equal(t, b.mail.MessagesFor("effect_key", w.key.String())[0].MessageID, out.Receipt.MessageID)
		require.Equal(t, 1, b.runs(t, w.st.WorkflowID), "in the same run")
		rec, err := b.effects.Get(b.ctx, w.key)
		require.NoError(t, err)
		require.Equal(t, effects.StateSucceeded, rec.State)
	}
	require.Equal(t, len(waits), b.mail.Count(), "no duplicate and no missing receipt")
	slices.Sort(settled)
	t.Logf("waits %d, settled by keyed %d in %d passes, left for a person 0; recovery to completed: p50 %s, max %s",
		len(waits), len(decided), passes, settled[len(settled)/2].Round(time.Millisecond), settled[len(settled)-1].Round(time.Millisecond))

	verdicts, err = s.Pass(b.ctx)
	require.NoError(t, err)
	require.Empty(t, verdicts, "nothing waits any more")
}

// A person who decides first wins: the settler's decision for the wait it
// read before is refused, changes nothing, and SendGrid holds one receipt.
func TestSettlerYieldsToAPersonWhoDecidedFirst(t *testing.T) {
	t.Parallel()
	b := setupLookupOutage(t)
	w := b.waitingReceipt(t, "first1", fakesendgrid.Fault{Kind: fakesendgrid.FaultServerError, Delay: 3 * time.Second})
	b.awaitAttention(t, w.st.WorkflowID)
	wait, err := pipeline.WaitOf(b.ctx, b.temporal, w.st.WorkflowID)
	require.NoError(t, err)
	require.Equal(t, w.key.String()+"#1", wait.Wait)
	require.False(t, wait.WaitingSince.IsZero())

	b.mail.SetLookupOutage(false)
	_, err = pipeline.SendDecision(b.ctx, b.temporal, w.st.WorkflowID, "", pipeline.Decision{Step: "receipt", Wait: wait.Wait,
		Resolution: effects.ResolveRetry, By: "ada", Reason: "not in SendGrid's activity feed"})
	require.NoError(t, err)
	_, err = b.wait(t, w.st)
	require.NoError(t, err)

	v := b.newSettler(t).Settle(b.ctx, wait) // The settler read the wait before the person decided.
	require.False(t, v.Applied)
	require.NotEmpty(t, v.Error, "the run moved on: %s", v.Evidence)
	require.Len(t, b.mail.MessagesFor("effect_key", w.key.String()), 1, "one receipt")
}
