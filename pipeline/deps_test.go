package pipeline_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// framework lists the packages of keyed's framework, and what they may
// import of the module: each other, and the libraries that know no domain.
var framework = []string{"step", "pipeline", "pipeline/pipelinetest", "slotshare"}

var frameworkMayImport = []string{"effects", "notify", "internal/tracing", "outbox", "outbox/temporalstart"}

// TestFrameworkImportsNoDomain walks the framework's dependencies (without
// tests) and fails on any package of the module outside the framework and
// the domain-free libraries: no pipeline's domain, activities or workflows.
func TestFrameworkImportsNoDomain(t *testing.T) {
	t.Parallel()
	const module = "github.com/keyedhq/keyed/"
	args := []string{"list", "-deps", "-f", "{{.ImportPath}}"}
	for _, p := range framework {
		args = append(args, module+p)
	}
	out, err := exec.Command("go", args...).CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	allowed := append(slices.Clone(framework), frameworkMayImport...)
	var checked int
	for _, path := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(path, module)
		if !ok {
			continue
		}
		checked++
		require.True(t, slices.Contains(allowed, rel), "the framework depends on %s", rel)
	}
	require.GreaterOrEqual(t, checked, len(framework))
}
