package digest

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestEqualIsConstantTime: Digest.Equal, which the gateway uses to compare
// token digests, pins and TLS keys, compares the sums with
// crypto/subtle.ConstantTimeCompare and nothing else (no ==, no
// bytes.Equal, no early exit); and the zero digest ("no pin") equals
// nothing, itself included. Timing is not measured (a timed test would be
// flaky); the code that decides is inspected instead.
func TestEqualIsConstantTime(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "digest.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var eq *ast.FuncDecl
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "Equal" && fd.Recv != nil {
			eq = fd
		}
	}
	if eq == nil {
		t.Fatal("digest.go: no method Equal")
	}
	subtle := false
	ast.Inspect(eq.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok {
					switch x.Name + "." + sel.Sel.Name {
					case "subtle.ConstantTimeCompare":
						subtle = true
					case "bytes.Equal", "slices.Equal", "reflect.DeepEqual":
						t.Errorf("%s: Equal calls %s.%s, which is not constant-time", fset.Position(n.Pos()), x.Name, sel.Sel.Name)
					}
				}
			}
		case *ast.BinaryExpr:
			if n.Op == token.EQL || n.Op == token.NEQ {
				if sel, ok := n.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "sum" {
					t.Errorf("%s: Equal compares the sums with %s", fset.Position(n.Pos()), n.Op)
				}
				if ix, ok := n.X.(*ast.IndexExpr); ok {
					if sel, ok := ix.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "sum" {
						t.Errorf("%s: Equal compares bytes of the sums with %s (early exit)", fset.Position(n.Pos()), n.Op)
					}
				}
			}
		}
		return true
	})
	if !subtle {
		t.Error("Digest.Equal does not use crypto/subtle.ConstantTimeCompare")
	}

	var zero Digest
	a := Bytes([]byte("a"))
	if zero.Equal(zero) || zero.Equal(a) || a.Equal(zero) {
		t.Error("the zero digest (no pin) compared equal")
	}
	if !a.Equal(Bytes([]byte("a"))) || a.Equal(Bytes([]byte("b"))) {
		t.Error("Equal is wrong on set digests")
	}
}

// TestTreeRefusesDevices: a device node in a tree is refused (TREE.md: devices,
// sockets and FIFOs are refused always; TestTreeRefuses covers the last two).
// The test makes a character device like /dev/null with mknod; where that is
// not permitted (not root) it measures /dev/pts, which holds the ptmx device
// on Linux.
func TestTreeRefusesDevices(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.js"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(filepath.Join(dir, "null"), syscall.S_IFCHR|0o644, 1<<8|3); err != nil {
		t.Logf("mknod: %v; measuring /dev/pts instead", err)
		dir = "/dev/pts"
	}
	_, err := Tree(context.Background(), dir, TreeOptions{})
	if !errors.Is(err, ErrSpecialFile) || !strings.Contains(err.Error(), "device") {
		t.Fatalf("Tree over a device = %v, want %v naming the device", err, ErrSpecialFile)
	}
}
