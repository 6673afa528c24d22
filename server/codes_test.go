package server

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"

	"github.com/bothy/bothy/errcode"
)

// parseCodes returns the values of the constants of type Code declared in a Go file.
func parseCodes(path string) ([]errcode.Code, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return nil, err
	}
	var codes []errcode.Code
	ast.Inspect(f, func(n ast.Node) bool {
		spec, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		if id, ok := spec.Type.(*ast.Ident); !ok || id.Name != "Code" {
			return true
		}
		for _, v := range spec.Values {
			if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					codes = append(codes, errcode.Code(s))
				}
			}
		}
		return true
	})
	return codes, nil
}
