package workflows_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeMaxLines is the README's budget: what keyed is, the two commands,
// the diagram, the package map and where to read next. The rest is in docs/.
const readmeMaxLines = 250

// TestREADMEIsShort checks that the README stays within readmeMaxLines.
func TestREADMEIsShort(t *testing.T) {
	t.Parallel()
	lines := strings.Count(readPage(t, "../README.md"), "\n")
	require.LessOrEqual(t, lines, readmeMaxLines, "README.md has %d lines; move the detail into a page under docs/", lines)
}

var (
	fence      = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
	inlineCode = regexp.MustCompile("`[^`\n]*`")
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading  = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	notInSlug  = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
)

// prose returns md without its code blocks and code spans.
func prose(md string) string {
	return inlineCode.ReplaceAllString(fence.ReplaceAllString(md, ""), "")
}

// anchors returns the anchors GitHub gives md's headings.
func anchors(md string) map[string]bool {
	out := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(fence.ReplaceAllString(md, ""), -1) {
		h := strings.ReplaceAll(strings.ToLower(m[1]), "`", "")
		out[strings.ReplaceAll(notInSlug.ReplaceAllString(h, ""), " ", "-")] = true
	}
	return out
}

// manuals returns the README, every page under docs/ and the package
// manuals, as paths from this package.
func manuals(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	require.NotEmpty(t, pages)
	return append([]string{"../README.md", "../api/README.md", "../deploy/README.md"}, pages...)
}

// TestEveryDocsPageIsLinkedFromTheREADME checks that no page under docs/
// is an orphan: the README's "Where to read next" table is how a reader
// finds them.
func TestEveryDocsPageIsLinkedFromTheREADME(t *testing.T) {
	t.Parallel()
	linked := map[string]bool{}
	for _, m := range mdLink.FindAllStringSubmatch(prose(readPage(t, "../README.md")), -1) {
		file, _, _ := strings.Cut(m[1], "#")
		linked[filepath.Clean(file)] = true
	}
	pages, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	for _, page := range pages {
		rel := filepath.Join("docs", filepath.Base(page))
		require.True(t, linked[rel], "README.md does not link %s; add it to \"Where to read next\"", rel)
	}
}

// TestManualLinksResolve checks every relative link in the manuals: its
// file exists, and its #anchor names a heading of the markdown it points at.
func TestManualLinksResolve(t *testing.T) {
	t.Parallel()
	for _, path := range manuals(t) {
		for _, m := range mdLink.FindAllStringSubmatch(prose(readPage(t, path)), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(link, "#")
			target := path
			if file != "" {
				target = filepath.Join(filepath.Dir(path), file)
			}
			_, err := os.Stat(target)
			require.NoError(t, err, "%s links %s, which does not exist", path, link)
			if anchor != "" && strings.HasSuffix(target, ".md") {
				require.True(t, anchors(readPage(t, target))[anchor], "%s links %s: %s has no such heading", path, link, target)
			}
		}
	}
}
