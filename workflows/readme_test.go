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

var updateREADME = flag.Bool("update-readme", false, "rewrite README's tables of declarations and outcomes from the pipelines' declarations")

// readmeSection returns the README's section that starts with heading, up
// to the next section of the same level.
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, sec, ok := strings.Cut(string(b), "\n"+heading+"\n")
	require.True(t, ok, "README has no %q", heading)
	sec, _, _ = strings.Cut(sec, "\n## ")
	return sec
}

// goBlocks returns the section's ```go blocks, without the indentation of a
// list item.
func goBlocks(sec string) []string {
	var blocks []string
	for _, part := range strings.Split(sec, "```go\n")[1:] {
		block, _, _ := strings.Cut(part, "```")
		lines := strings.Split(block, "\n")
		indent := lines[0][:len(lines[0])-len(strings.TrimLeft(lines[0], " "))]
		for i, l := range lines {
			lines[i] = strings.TrimPrefix(l, indent)
		}
		blocks = append(blocks, strings.TrimRight(strings.Join(lines, "\n"), " \n"))
	}
	return blocks
}

// declarations returns every pipeline's declared steps, then ApplyDecision.
func declarations() []step.Declaration {
	var out []step.Declaration
	for _, s := range workflows.Pipelines() {
		out = append(out, s.Steps...)
	}
	return append(out, pipeline.DeclDecision)
}

// declarationsTable renders declarations as the README's table.
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

// TestREADMEListsTheDeclarations checks README's table of the declared
// activities against the pipelines' declarations; with -update-readme it rewrites it.
func TestREADMEListsTheDeclarations(t *testing.T) {
	t.Parallel()
	sec := readmeSection(t, "## Adding a keyed activity")
	_, table, ok := strings.Cut(sec, "<!-- declarations -->\n")
	require.True(t, ok, "README's section has no <!-- declarations --> table")
	table, _, _ = strings.Cut(table, "<!-- /declarations -->")
	if *updateREADME && table != declarationsTable() {
		b, err := os.ReadFile("../README.md")
		require.NoError(t, err)
		marked := "<!-- declarations -->\n" + table + "<!-- /declarations -->"
		require.Equal(t, 1, strings.Count(string(b), marked))
		b = []byte(strings.Replace(string(b), marked, "<!-- declarations -->\n"+declarationsTable()+"<!-- /declarations -->", 1))
		require.NoError(t, os.WriteFile("../README.md", b, 0o644))
		return
	}
	require.Equal(t, declarationsTable(), table, "README's table of declarations; run go test ./workflows/ -run TestREADME -update-readme")
}

// outcomesTable renders each declared step's done result as the README's
// table.
func outcomesTable() string {
	var b strings.Builder
	b.WriteString("  | step | `result` with `done` |\n")
	b.WriteString("  | --- | --- |\n")
	for _, d := range declarations()[:len(declarations())-1] {
		fmt.Fprintf(&b, "  | `%s` | `%s` |\n", d.Step, d.Outcome.Shape())
	}
	return b.String()
}

// TestREADMEListsTheOutcomes checks README's table of the result a done
// decision carries for each declared step against the declarations'
// Outcome.
func TestREADMEListsTheOutcomes(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(b), "<!-- outcomes -->\n")
	require.True(t, ok, "README has no <!-- outcomes --> table")
	table, _, _ = strings.Cut(table, "  <!-- /outcomes -->")
	if *updateREADME && table != outcomesTable() {
		b = []byte(strings.Replace(string(b), "<!-- outcomes -->\n"+table, "<!-- outcomes -->\n"+outcomesTable(), 1))
		require.NoError(t, os.WriteFile("../README.md", b, 0o644))
		return
	}
	require.Equal(t, outcomesTable(), table, "README's table of done outcomes; run go test ./workflows/ -run TestREADME -update-readme")
}

// TestREADMEExampleIsCompiled checks that the code README's "Adding a keyed
// activity" shows is the code in the tree: the activity, runAddedStep and
// the second-run test.
func TestREADMEExampleIsCompiled(t *testing.T) {
	t.Parallel()
	blocks := goBlocks(readmeSection(t, "## Adding a keyed activity"))
	require.Len(t, blocks, 4)
	for _, c := range []struct {
		block int
		file  string
	}{{0, "../activities/order/example_survey_test.go"}, {2, "../pipeline/run.go"}, {3, "../activities/order/example_test.go"}} {
		src, err := os.ReadFile(c.file)
		require.NoError(t, err)
		require.Contains(t, string(src), blocks[c.block], "README's block %d is not in %s", c.block, c.file)
	}
}
