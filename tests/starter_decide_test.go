package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/effects"
	"github.com/keyedhq/keyed/internal/fakesendgrid"
	"github.com/keyedhq/keyed/orders"
	"github.com/keyedhq/keyed/pipeline"
)

// TestStarterResolveDecidesAWaitingRun: the operator's CLI finds a waiting
// run with `starter attention` and decides it with `starter resolve`, which
// sends the decide update; the run continues in the same run ID. The
// decision is "retry" although SendGrid did take the message: the retry
// looks the key up first and sends nothing twice.
func TestStarterResolveDecidesAWaitingRun(t *testing.T) {
	t.Parallel()
	b := setupLookupOutage(t)
	w := b.waitingReceipt(t, "cli1", fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
	b.awaitAttention(t, w.st.WorkflowID)

	starter := b.starterCLI(t)

	var listed []pipeline.Attention
	decodeJSON(t, starter("attention", "--json"), &listed)
	require.Contains(t, listed, pipeline.Attention{WorkflowID: w.st.WorkflowID, RunID: w.st.RunID, WorkflowType: orders.WorkflowName, TenantID: b.tenant,
		Keywords: map[string]string{orders.SearchAttrOrderID: "cli1"}, Attention: "receipt:ambiguous", StartTime: listed[indexOf(listed, w.st.WorkflowID)].StartTime,
		Wait: w.key.String() + "#1", WaitingSince: listed[indexOf(listed, w.st.WorkflowID)].WaitingSince})
	require.False(t, listed[indexOf(listed, w.st.WorkflowID)].WaitingSince.IsZero(), "when the wait began")

	b.mail.SetLookupOutage(false)
	got := starter("resolve", "--key", w.key.String(), "--as", "retry", "--by", "ada", "--reason", "SendGrid answers again")
	require.Contains(t, got, w.key.String()+" decided retry in the waiting run")

	res, err := b.wait(t, w.st)
	require.NoError(t, err)
	require.Len(t, b.mail.MessagesFor("effect_key", w.key.String()), 1, "the retry found the message; nothing sent twice")
	require.Equal(t, b.mail.MessagesFor("effect_key", w.key.String())[0].MessageID, res.Receipt.MessageID)
	require.Equal(t, 1, b.runs(t, w.st.WorkflowID), "the same run went on")
	rec := b.records(t, "cli1")["receipt"]
	require.Equal(t, effects.StateSucceeded, rec.State)
}

// starterCLI builds cmd/starter and returns a function that runs it with
// args against the test's schema and the dev server, requires exit 0 and
// returns its output.
func (b *bundle) starterCLI(t *testing.T) func(args ...string) string {
	t.Helper()
	run := b.starterRun(t)
	return func(args ...string) string {
		t.Helper()
		code, out := run(args...)
		require.Zero(t, code, "starter %v:\n%s", args, out)
		return out
	}
}

// starterRun builds cmd/starter and returns a function that runs it with
// args against the test's schema and the dev server, with env added to its
// environment, and returns its exit code and its output: standard output,
// then standard error (warnings, such as a run of another test on the same
// server that no worker answers any more), so that a --json command's
// output starts with its JSON.
func (b *bundle) starterRun(t *testing.T, env ...string) func(args ...string) (int, string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "starter")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/keyedhq/keyed/cmd/starter").CombinedOutput()
	require.NoError(t, err, "build cmd/starter: %s", out)
	return func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.CommandContext(b.ctx, bin, args...)
		cmd.Env = append(append(os.Environ(), "DATABASE_URL="+b.dbURL, "TEMPORAL_ADDRESS="+temporalAddr, "TEMPORAL_NAMESPACE=default"), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		out := stdout.String() + stderr.String()
		var exit *exec.ExitError
		if err != nil {
			require.ErrorAs(t, err, &exit, "starter %v:\n%s", args, out)
			return exit.ExitCode(), out
		}
		return 0, out
	}
}

// decodeJSON decodes the JSON value that out starts with into v: a --json
// command's output, before any warning starterRun appends.
func decodeJSON(t *testing.T, out string, v any) {
	t.Helper()
	require.NoError(t, json.NewDecoder(strings.NewReader(out)).Decode(v), out)
}

func indexOf(as []pipeline.Attention, workflowID string) int {
	for i, a := range as {
		if a.WorkflowID == workflowID {
			return i
		}
	}
	return 0
}

// starter resolve --query decides in a batch: --dry-run lists each waiting
// run with the provider's evidence and decides nothing; a done takes each
// run's outcome from SendGrid and skips, saying so, a run without one; a
// retry decides the rest. One receipt each at SendGrid.
func TestStarterResolveQueryDecidesInABatch(t *testing.T) {
	t.Parallel()
	b := setupLookupOutage(t)
	sent := b.waitingReceipt(t, "batch1", fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
	lost := b.waitingReceipt(t, "batch2", fakesendgrid.Fault{Kind: fakesendgrid.FaultServerError, Delay: 3 * time.Second})
	for _, w := range []*waitingOrder{sent, lost} {
		b.awaitAttention(t, w.st.WorkflowID)
	}
	run := b.starterRun(t, "SENDGRID_API_KEY="+sendgridKey, "SENDGRID_API_BASE="+b.mailURL)
	query := "TaskQueue = '" + b.taskQueue + "'"
	env := []string{"--query", query, "--by", "ada", "--reason", "batch after the SendGrid outage"}

	code, out := run(append([]string{"resolve", "--as", "done", "--dry-run"}, env...)...)
	require.Zero(t, code, out)
	require.Contains(t, out, sent.key.String()+"#1")
	require.Contains(t, out, lost.key.String()+"#1")
	require.Contains(t, out, "not definitive", "the look-up is down: the evidence says so")
	require.True(t, b.listed(t, sent.st.WorkflowID) && b.listed(t, lost.st.WorkflowID), "a dry run decides nothing")

	b.mail.SetLookupOutage(false)
	require.Eventually(t, func() bool { // Past the index lag, the evidence is definitive.
		code, out = run(append([]string{"resolve", "--as", "done"}, env...)...)
		return regexp.MustCompile(`\s{2}decided\s{2}`).MatchString(out)
	}, 30*time.Second, time.Second, "last: %s", out)
	require.Equal(t, 2, code, "one run had no outcome to take: %s", out)
	require.Contains(t, out, "no outcome found at the provider")
	_, err := b.wait(t, sent.st)
	require.NoError(t, err)

	code, out = run(append([]string{"resolve", "--as", "retry"}, env...)...)
	require.Zero(t, code, out)
	_, err = b.wait(t, lost.st)
	require.NoError(t, err)
	for _, w := range []*waitingOrder{sent, lost} {
		require.Len(t, b.mail.MessagesFor("effect_key", w.key.String()), 1, "one receipt for %s", w.id)
	}
	code, out = run("resolve", "--query", query, "--key", sent.key.String(), "--as", "retry", "--by", "ada", "--reason", "x")
	require.Equal(t, 2, code)
	require.Contains(t, out, "give no --key")
}
