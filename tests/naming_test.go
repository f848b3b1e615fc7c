package tests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoEffectsClientIsNamedFx walks every Go file of the module, tests
// included, and refuses an *effects.Client named fx (a field, parameter,
// variable or the result of effects.NewClient or effectstest.NewClient):
// fx is the DI framework's name, and the effects client is claims.
func TestNoEffectsClientIsNamedFx(t *testing.T) {
	t.Parallel()
	var found []string
	files := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go"):
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, pos := range clientsNamedFx(f) {
			found = append(found, fset.Position(pos).String())
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, files, 100, "the walk found the module's files")
	require.Empty(t, found, "an *effects.Client is named fx; name it claims")
}

// clientsNamedFx returns where f names an effects client fx.
func clientsNamedFx(f *ast.File) []token.Pos {
	var out []token.Pos
	// selector returns pkg and name of an expression pkg.name.
	selector := func(e ast.Expr) (pkg, name string) {
		if sel, ok := e.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok {
				return id.Name, sel.Sel.Name
			}
		}
		return "", ""
	}
	isClient := func(e ast.Expr) bool {
		star, ok := e.(*ast.StarExpr)
		if !ok {
			return false
		}
		pkg, name := selector(star.X)
		return pkg == "effects" && name == "Client"
	}
	isNewClient := func(e ast.Expr) bool {
		call, ok := e.(*ast.CallExpr)
		if !ok {
			return false
		}
		pkg, name := selector(call.Fun)
		return (pkg == "effects" || pkg == "effectstest") && name == "NewClient"
	}
	named := func(ids []*ast.Ident) {
		for _, id := range ids {
			if id.Name == "fx" {
				out = append(out, id.Pos())
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Field: // struct fields, parameters and results
			if isClient(n.Type) {
				named(n.Names)
			}
		case *ast.ValueSpec:
			if n.Type != nil && isClient(n.Type) {
				named(n.Names)
			}
			if len(n.Values) == 1 && isNewClient(n.Values[0]) && len(n.Names) > 0 {
				named(n.Names[:1])
			}
		case *ast.AssignStmt:
			if len(n.Rhs) == 1 && isNewClient(n.Rhs[0]) && len(n.Lhs) > 0 {
				if id, ok := n.Lhs[0].(*ast.Ident); ok {
					named([]*ast.Ident{id})
				}
			}
		case *ast.KeyValueExpr: // Pruner{fx: …} and the like
			if id, ok := n.Key.(*ast.Ident); ok && id.Name == "fx" {
				if _, isCall := n.Value.(*ast.CallExpr); !isCall || isNewClient(n.Value) {
					named([]*ast.Ident{id})
				}
			}
		}
		return true
	})
	return out
}
