package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

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
	b := setup(t)
	b.deps = b.newDeps(t, lookupOutageOpts)
	b.startDecidingWorker(t)
	b.mail.SetLookupOutage(true)
	w := b.waitingReceipt(t, "cli1", fakesendgrid.Fault{Kind: fakesendgrid.FaultDropResponse})
	b.awaitAttention(t, w.st.WorkflowID)

	starter := b.starterCLI(t)

	var listed []pipeline.Attention
	require.NoError(t, json.Unmarshal([]byte(starter("attention", "--json")), &listed))
	require.Contains(t, listed, pipeline.Attention{WorkflowID: w.st.WorkflowID, RunID: w.st.RunID, WorkflowType: orders.WorkflowName, TenantID: b.tenant,
		Keywords: map[string]string{orders.SearchAttrOrderID: "cli1"}, Attention: "receipt:ambiguous", StartTime: listed[indexOf(listed, w.st.WorkflowID)].StartTime})

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
// args against the test's schema and the dev server, and returns its exit
// code and combined output.
func (b *bundle) starterRun(t *testing.T) func(args ...string) (int, string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "starter")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/keyedhq/keyed/cmd/starter").CombinedOutput()
	require.NoError(t, err, "build cmd/starter: %s", out)
	return func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.CommandContext(b.ctx, bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+b.dbURL, "TEMPORAL_ADDRESS="+temporalAddr, "TEMPORAL_NAMESPACE=default")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil {
			require.ErrorAs(t, err, &exit, "starter %v:\n%s", args, out)
			return exit.ExitCode(), string(out)
		}
		return 0, string(out)
	}
}

func indexOf(as []pipeline.Attention, workflowID string) int {
	for i, a := range as {
		if a.WorkflowID == workflowID {
			return i
		}
	}
	return 0
}
