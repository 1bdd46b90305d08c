package httpfront

import (
	"go/ast"
	"go/token"
	"testing"
)

// checkEqualRunsEveryIteration is part of TestTokensComparedInConstantTime:
// in every loop of fn's body, each digest.Digest.Equal call is evaluated on
// every iteration, whatever the tokens before matched. It is not on the
// right of a && or || (short-circuited once the left decides), in the
// body of an if, switch, select or nested loop, or in a function literal,
// and the loop has no continue, break, goto or return. Otherwise the time
// taken would say where in the token list a match is (`if who == "" &&
// got.Equal(t.Digest)` once passed this test; found in review). With
// needLoop, fn must compare inside a loop (over the tokens in force).
func checkEqualRunsEveryIteration(t *testing.T, fset *token.FileSet, fn string, body *ast.BlockStmt, needLoop bool) {
	t.Helper()
	inLoop := 0
	ast.Inspect(body, func(n ast.Node) bool {
		loop, ok := n.(*ast.RangeStmt)
		if !ok {
			if f, ok := n.(*ast.ForStmt); ok {
				loop = &ast.RangeStmt{Body: f.Body}
			} else {
				return true
			}
		}
		var stack []ast.Node
		ast.Inspect(loop.Body, func(m ast.Node) bool {
			if m == nil {
				stack = stack[:len(stack)-1]
				return true
			}
			stack = append(stack, m)
			switch m := m.(type) {
			case *ast.BranchStmt:
				if m.Tok != token.FALLTHROUGH {
					t.Errorf("%s: %s leaves an iteration of the token loop early (%s)", fset.Position(m.Pos()), fn, m.Tok)
				}
			case *ast.ReturnStmt:
				t.Errorf("%s: %s returns from inside the token loop (early exit)", fset.Position(m.Pos()), fn)
			case *ast.CallExpr:
				sel, ok := m.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Equal" {
					return true
				}
				inLoop++
				if why := conditional(loop.Body, stack); why != "" {
					t.Errorf("%s: %s's Equal in the token loop is not evaluated on every iteration: %s", fset.Position(m.Pos()), fn, why)
				}
			}
			return true
		})
		return false
	})
	if needLoop && inLoop == 0 {
		t.Errorf("%s compares no token with Equal inside a loop over the tokens", fn)
	}
}

// conditional says why the innermost node of path (a path from the loop
// body down) is evaluated only under some condition, or "".
func conditional(loopBody *ast.BlockStmt, path []ast.Node) string {
	for i := 1; i < len(path); i++ {
		parent, child := path[i-1], path[i]
		switch p := parent.(type) {
		case *ast.BlockStmt:
			if p != loopBody {
				return "it is in a nested block"
			}
		case *ast.IfStmt:
			if child != p.Init && child != p.Cond {
				return "it is in the body of an if"
			}
		case *ast.BinaryExpr:
			if (p.Op == token.LAND || p.Op == token.LOR) && child == p.Y {
				return "it is on the right of " + p.Op.String() + ", evaluated only when the left does not decide"
			}
		case *ast.SwitchStmt, *ast.TypeSwitchStmt, *ast.SelectStmt, *ast.CaseClause, *ast.CommClause:
			return "it is in a switch or select"
		case *ast.ForStmt, *ast.RangeStmt:
			return "it is in a nested loop"
		case *ast.FuncLit:
			return "it is in a function literal"
		}
	}
	return ""
}
