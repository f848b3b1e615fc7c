package workflows_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/pipeline"
	"github.com/keyedhq/keyed/step"
	"github.com/keyedhq/keyed/workflows"
)

var updateREADME = flag.Bool("update-readme", false, "rewrite the tables of declarations ("+activityPage+") and outcomes ("+operatingPage+") from the pipelines' declarations")

const (
	// activityPage holds the walkthrough, its compiled code and the table
	// of declarations.
	activityPage = "../docs/adding-an-activity.md"
	// operatingPage holds the table of done outcomes.
	operatingPage = "../docs/operating.md"
)

// readPage returns the text of a manual page.
func readPage(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// declarations returns every pipeline's declared steps, then ApplyDecision.
func declarations() []step.Declaration {
	var out []step.Declaration
	for _, s := range workflows.Pipelines() {
		out = append(out, s.Steps...)
	}
	return append(out, pipeline.DeclDecision)
}

// declarationsTable renders declarations as activityPage's table.
func declarationsTable() string {
	var b strings.Builder
	b.WriteString("| activity | effect class | key step | delivery policy | per attempt | heartbeat | all attempts |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, d := range declarations() {
		o := d.ActivityOptions("")
		policy, hb := string(d.Policy), o.HeartbeatTimeout.String()
		if policy == "" {
			policy = "—"
		}
		if o.HeartbeatTimeout == 0 {
			hb = "none"
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s | %s | %s | %s |\n",
			d.Name, d.Class, d.Step, policy, o.StartToCloseTimeout, hb, o.ScheduleToCloseTimeout)
	}
	return b.String()
}

// TestREADMEListsTheDeclarations checks activityPage's table of the
// declared activities against the pipelines' declarations; with
// -update-readme it rewrites it.
func TestREADMEListsTheDeclarations(t *testing.T) {
	t.Parallel()
	page := readPage(t, activityPage)
	_, table, ok := strings.Cut(page, "<!-- declarations -->\n")
	require.True(t, ok, "%s has no <!-- declarations --> table", activityPage)
	table, _, _ = strings.Cut(table, "<!-- /declarations -->")
	if *updateREADME && table != declarationsTable() {
		marked := "<!-- declarations -->\n" + table + "<!-- /declarations -->"
		require.Equal(t, 1, strings.Count(page, marked))
		page = strings.Replace(page, marked, "<!-- declarations -->\n"+declarationsTable()+"<!-- /declarations -->", 1)
		require.NoError(t, os.WriteFile(activityPage, []byte(page), 0o644))
		return
	}
	require.Equal(t, declarationsTable(), table, "%s's table of declarations; run go test ./workflows/ -run TestREADME -update-readme", activityPage)
}

// outcomesTable renders each declared step's done result as
// operatingPage's table.
func outcomesTable() string {
	var b strings.Builder
	b.WriteString("  | step | `result` with `done` |\n")
	b.WriteString("  | --- | --- |\n")
	for _, d := range declarations()[:len(declarations())-1] {
		fmt.Fprintf(&b, "  | `%s` | `%s` |\n", d.Step, d.Outcome.Shape())
	}
	return b.String()
}

// TestREADMEListsTheOutcomes checks operatingPage's table of the result a
// done decision carries for each declared step against the declarations'
// Outcome.
func TestREADMEListsTheOutcomes(t *testing.T) {
	t.Parallel()
	_, table, ok := strings.Cut(readPage(t, operatingPage), "<!-- outcomes -->\n")
	require.True(t, ok, "%s has no <!-- outcomes --> table", operatingPage)
	table, _, _ = strings.Cut(table, "  <!-- /outcomes -->")
	if *updateREADME && table != outcomesTable() {
		page := strings.Replace(readPage(t, operatingPage), "<!-- outcomes -->\n"+table, "<!-- outcomes -->\n"+outcomesTable(), 1)
		require.NoError(t, os.WriteFile(operatingPage, []byte(page), 0o644))
		return
	}
	require.Equal(t, outcomesTable(), table, "%s's table of done outcomes; run go test ./workflows/ -run TestREADME -update-readme", operatingPage)
}
