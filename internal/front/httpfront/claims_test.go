package httpfront

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// TestTokensComparedInConstantTime: agent and admin bearer tokens are only
// ever compared as SHA-256 digests with digest.Digest.Equal (crypto/subtle,
// see pkg/digest TestEqualIsConstantTime), never with == or a string or
// byte comparison, and the agent token is compared against every configured
// token without an early exit. The configuration holds token digests only.
// Timing is not measured (a timed test would be flaky); the code that
// decides is inspected. TestAuthentication and TestAdminRequiresItsOwnToken
// check which tokens are accepted.
func TestTokensComparedInConstantTime(t *testing.T) {
	if f, ok := reflect.TypeOf(Token{}).FieldByName("Digest"); !ok || f.Type != reflect.TypeOf(digest.Digest{}) || reflect.TypeOf(Token{}).NumField() != 2 {
		t.Fatalf("Token must hold only a digest.Digest and an identity: %v", reflect.TypeOf(Token{}))
	}
	for _, c := range []struct{ file, fn string }{{"auth.go", "authenticate"}, {"../../admin/admin.go", "authorized"}} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, c.file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		var body *ast.BlockStmt
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == c.fn {
				body = fd.Body
			}
		}
		if body == nil {
			t.Fatalf("%s: no func %s", c.file, c.fn)
		}
		secret := map[string]bool{"tok": true, "got": true}
		mentionsSecret := func(e ast.Expr) bool {
			found := false
			ast.Inspect(e, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok && secret[id.Name] {
					found = true
				}
				return true
			})
			return found
		}
		isEmptyString := func(e ast.Expr) bool {
			bl, ok := e.(*ast.BasicLit)
			return ok && bl.Kind == token.STRING && bl.Value == `""`
		}
		usesEqual := false
		ast.Inspect(body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if (n.Op == token.EQL || n.Op == token.NEQ) && (mentionsSecret(n.X) || mentionsSecret(n.Y)) && !isEmptyString(n.X) && !isEmptyString(n.Y) {
					t.Errorf("%s: %s compares the token with %s", fset.Position(n.Pos()), c.fn, n.Op)
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if sel.Sel.Name == "Equal" {
					usesEqual = true
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "strings" || x.Name == "bytes") {
					switch sel.Sel.Name {
					case "EqualFold", "Equal", "Compare", "HasPrefix", "HasSuffix", "Contains":
						for _, a := range n.Args {
							if mentionsSecret(a) {
								t.Errorf("%s: %s compares the token with %s.%s", fset.Position(n.Pos()), c.fn, x.Name, sel.Sel.Name)
							}
						}
					}
				}
			case *ast.RangeStmt:
				ast.Inspect(n.Body, func(m ast.Node) bool {
					switch m := m.(type) {
					case *ast.ReturnStmt:
						t.Errorf("%s: %s returns from inside the token loop (early exit)", fset.Position(m.Pos()), c.fn)
					case *ast.BranchStmt:
						if m.Tok == token.BREAK {
							t.Errorf("%s: %s breaks out of the token loop (early exit)", fset.Position(m.Pos()), c.fn)
						}
					}
					return true
				})
			}
			return true
		})
		if !usesEqual {
			t.Errorf("%s: %s does not compare with digest.Digest.Equal", c.file, c.fn)
		}
		checkEqualRunsEveryIteration(t, fset, c.fn, body, c.fn == "authenticate")
	}
}
