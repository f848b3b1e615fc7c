package toolbin_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/toolbin"
)

// From a package's directory, bin/ is beside the module's go.mod.
func TestDirIsBesideGoMod(t *testing.T) {
	dir, err := toolbin.Dir()
	require.NoError(t, err)
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "bin"), dir)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
}

// Outside any module there is no bin/ to find.
func TestDirOutsideAModule(t *testing.T) {
	t.Chdir(t.TempDir())
	_, err := toolbin.Dir()
	require.ErrorContains(t, err, "no go.mod above")
}
