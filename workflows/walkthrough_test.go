package workflows_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goBlock is a ```go block of a docs page and the file it names.
var goBlock = regexp.MustCompile("(?s)```go( file=(\\S+))?\n(.*?)```")

// TestDocsCodeIsCompiled checks that every Go block of the walkthrough
// pages names a file of the tree (```go file=PATH) and is text of that
// file, which go test compiles: the pages show code that builds and runs.
func TestDocsCodeIsCompiled(t *testing.T) {
	t.Parallel()
	for _, page := range []string{"adding-an-activity.md", "adding-a-pipeline.md"} {
		b, err := os.ReadFile("../docs/" + page)
		require.NoError(t, err)
		blocks := goBlock.FindAllStringSubmatch(string(b), -1)
		require.NotEmpty(t, blocks, page)
		for _, m := range blocks {
			file, code := m[2], m[3]
			require.NotEmpty(t, file, "%s: a go block names no file:\n%s", page, code)
			require.True(t, strings.HasSuffix(file, ".go"), "%s: %s", page, file)
			src, err := os.ReadFile("../" + file)
			require.NoError(t, err, page)
			require.Contains(t, string(src), code, "%s: a block is not the text of %s", page, file)
		}
	}
}
