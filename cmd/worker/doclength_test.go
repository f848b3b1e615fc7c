package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxDocFloor is the doc length any function may have whatever its body:
// a contract (what it does, its errors, its effect class) fits in it.
const maxDocFloor = 8

// TestDocCommentsStateContracts walks the module's non-test Go files and
// fails on every function or method whose doc comment has more lines than
// max(its body, maxDocFloor): design discussion belongs in docs/design.md.
func TestDocCommentsStateContracts(t *testing.T) {
	t.Parallel()
	var long []string
	funcs := 0
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != "../.." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			funcs++
			if fn.Doc == nil {
				continue
			}
			doc := fset.Position(fn.Doc.End()).Line - fset.Position(fn.Doc.Pos()).Line + 1
			body := fset.Position(fn.Body.Rbrace).Line - fset.Position(fn.Body.Lbrace).Line - 1
			if doc > max(body, maxDocFloor) {
				long = append(long, fmt.Sprintf("%s %s: doc %d lines, body %d",
					fset.Position(fn.Pos()), fn.Name.Name, doc, body))
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, funcs, 500, "the walk found the module's functions")
	require.Empty(t, long, "doc comments longer than max(body, %d) lines; keep the contract, move design talk to docs/design.md:\n%s",
		maxDocFloor, strings.Join(long, "\n"))
}
