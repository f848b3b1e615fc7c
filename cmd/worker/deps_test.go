package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBinariesLinkNoTestTooling walks the dependencies of the shipped
// binaries and fails on a package that only tests need: the dev server,
// the provider fakes, the fault injector, the Postgres cluster, the test
// helpers.
func TestBinariesLinkNoTestTooling(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}",
		"github.com/keyedhq/keyed/cmd/worker", "github.com/keyedhq/keyed/cmd/starter").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	const module = "github.com/keyedhq/keyed/"
	forbidden := []string{"internal/devserver", "internal/tempcluster", "internal/fake", "internal/pgcluster", "internal/dbtest", "internal/logbuf", "internal/stripemock", "internal/toolbin", "test"}
	var checked int
	for _, path := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(path, module)
		if !ok {
			continue
		}
		checked++
		for _, f := range forbidden {
			last := rel[strings.LastIndex(rel, "/")+1:]
			require.False(t, strings.HasPrefix(rel, f) || (f == "test" && strings.HasSuffix(last, "test")),
				"a shipped binary links %s", rel)
		}
	}
	require.Greater(t, checked, 10)
}

// TestWorkerLinksNoAPI pins that the worker, which serves no HTTP API, does
// not link package api: the API's constants it needs live in internal/config.
func TestWorkerLinksNoAPI(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}",
		"github.com/keyedhq/keyed/cmd/worker").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	require.NotContains(t, strings.Fields(string(out)), "github.com/keyedhq/keyed/api")
	require.Contains(t, strings.Fields(string(out)), "github.com/keyedhq/keyed/internal/fxapp")
}
