package effects_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImportsStayInsideEffects pins that effects is a library of its own:
// effects and effectstest, tests included, import nothing from keyed outside
// effects/.
func TestImportsStayInsideEffects(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", ".", "./effectstest").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	const module, own = "github.com/keyedhq/keyed/", "github.com/keyedhq/keyed/effects"
	var checked int
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, _, _ := strings.Cut(line, " ") // "pkg [pkg.test]" is pkg as its tests build it
		if !strings.HasPrefix(path, module) {
			continue
		}
		checked++
		path = strings.TrimSuffix(strings.TrimSuffix(path, ".test"), "_test")
		require.True(t, path == own || strings.HasPrefix(path, own+"/"), "effects depends on %s", path)
	}
	require.NotZero(t, checked)
}
