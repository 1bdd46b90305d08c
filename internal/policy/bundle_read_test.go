package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// TestPinnedDigestIsOfTheParsedBundle: the digest compared with the pin is
// the digest of the bytes parsed. Here a permit-all policy is on disk
// except while the bundle's files are hashed one after the other, when the
// approved deny-all policy is there (an attacker swapping A -> B -> A with
// inotify). Load read the tree for parsing, hashed it again and re-read it
// to compare, so the parsed permit-all bundle was loaded under the
// deny-all bundle's digest (found in review). Whatever Load accepts under
// the pin must decide as the approved bundle.
func TestPinnedDigestIsOfTheParsedBundle(t *testing.T) {
	// One worker: the files are hashed in path order and Progress runs
	// after each, so the swaps below fall between them.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	approved := "forbid (principal, action, resource);\n"
	evil := "permit (principal, action, resource);\n"
	ref := bundle(t, map[string]string{"schema.cedarschema": exampleSchema(t), "z.cedar": approved})
	b0, err := Load(context.Background(), ref, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pin := b0.Digest()
	call := &Request{Action: ActionCallTool, Agent: "mallory", Tool: "fs__delete", ToolName: "delete", Upstream: "fs"}
	if b0.Decide(call).Allow {
		t.Fatal("the approved bundle allows the call")
	}

	for _, swapAt := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("approved on disk from file %d hashed", swapAt), func(t *testing.T) {
			dir := bundle(t, map[string]string{"schema.cedarschema": exampleSchema(t), "z.cedar": evil})
			target := filepath.Join(dir, "z.cedar")
			if swapAt == 0 {
				if err := os.WriteFile(target, []byte(approved), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			n := 0
			b, err := Load(context.Background(), dir, LoadOptions{Expect: pin, Progress: func(files, _ int64) {
				n++
				switch n {
				case swapAt:
					os.WriteFile(target, []byte(approved), 0o644)
				case swapAt + 1:
					os.WriteFile(target, []byte(evil), 0o644)
				}
			}})
			if err != nil {
				t.Logf("refused: %v", err)
				return
			}
			if !b.Digest().Equal(pin) {
				t.Fatalf("loaded with digest %s, not the pin %s", b.Digest(), pin)
			}
			if d := b.Decide(call); d.Allow {
				t.Fatalf("loaded under the approved pin %s, but the bundle parsed is another: it allows the call (%s)", pin, d.Reason)
			}
		})
	}
}

// TestBundleDigestIsTheTreeDigest: a bundle's digest is digest.Tree's for
// its directory, every file counted (subdirectories, notes, links that
// stay inside), so a pin from `cmcp spawn-digest --target DIR` or by hand
// (TREE.md) is the one Load compares.
func TestBundleDigestIsTheTreeDigest(t *testing.T) {
	dir := bundle(t, map[string]string{
		"schema.cedarschema": exampleSchema(t),
		"a.cedar":            "permit (principal, action, resource);\n",
		"sub/b.cedar":        "forbid (principal, action == Action::\"call_tool\", resource);\n",
		"NOTES.md":           "notes\n",
		"empty.cedar.txt":    "",
	})
	if err := os.Mkdir(filepath.Join(dir, "emptydir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("NOTES.md", filepath.Join(dir, "README")); err != nil {
		t.Fatal(err)
	}
	b, err := Load(context.Background(), dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := digest.Tree(context.Background(), dir, digest.TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !b.Digest().Equal(want) {
		t.Fatalf("bundle digest %s, digest.Tree %s", b.Digest(), want)
	}
	if got := strings.Join(b.Files(), " "); got != "a.cedar sub/b.cedar schema.cedarschema" {
		t.Fatalf("files %q", got)
	}
	// A policy.dir that is a symbolic link is the directory it names, as
	// for digest.Tree (it was walked as a lone link: "no .cedarschema").
	link := filepath.Join(t.TempDir(), "bundle")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if bl, err := Load(context.Background(), link, LoadOptions{Expect: want}); err != nil || !bl.Digest().Equal(want) {
		t.Fatalf("through a link: %v", err)
	}
}

// TestBundleReadIsBounded: the bundle is read into memory once, so what is
// kept is bounded: at most maxBundleFiles entries and maxFileBytes per
// policy or schema. Other files are hashed, not kept, and count in the
// digest whatever their size.
func TestBundleReadIsBounded(t *testing.T) {
	sch := exampleSchema(t)
	policy := "permit (principal, action, resource);\n"
	t.Run("a large policy", func(t *testing.T) {
		dir := bundle(t, map[string]string{"schema.cedarschema": sch, "a.cedar": policy + strings.Repeat("//\n", maxFileBytes/3+1)})
		_, err := Load(context.Background(), dir, LoadOptions{})
		var le *LoadError
		if !errors.As(err, &le) || le.ExitCode() != exitcode.ExitConfig || !strings.Contains(err.Error(), "a.cedar") || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a large schema", func(t *testing.T) {
		dir := bundle(t, map[string]string{"schema.cedarschema": sch + strings.Repeat("//\n", maxFileBytes/3+1), "a.cedar": policy})
		_, err := Load(context.Background(), dir, LoadOptions{})
		if err == nil || !strings.Contains(err.Error(), "schema.cedarschema") || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a large note", func(t *testing.T) {
		dir := bundle(t, map[string]string{"schema.cedarschema": sch, "a.cedar": policy, "NOTES.md": strings.Repeat("x", maxFileBytes+1)})
		b, err := Load(context.Background(), dir, LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want, err := digest.Tree(context.Background(), dir, digest.TreeOptions{})
		if err != nil || !b.Digest().Equal(want) {
			t.Fatalf("digest %s, digest.Tree %s, %v", b.Digest(), want, err)
		}
	})
	t.Run("too many files", func(t *testing.T) {
		dir := bundle(t, map[string]string{"schema.cedarschema": sch, "a.cedar": policy})
		for i := range maxBundleFiles {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("n%05d", i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Load(context.Background(), dir, LoadOptions{})
		var le *LoadError
		if !errors.As(err, &le) || le.ExitCode() != exitcode.ExitConfig || le.File != dir || !strings.Contains(err.Error(), fmt.Sprintf("more than %d", maxBundleFiles)) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a policy that is a link", func(t *testing.T) {
		dir := bundle(t, map[string]string{"schema.cedarschema": sch, "a.txt": policy})
		if err := os.Symlink("a.txt", filepath.Join(dir, "a.cedar")); err != nil {
			t.Fatal(err)
		}
		_, err := Load(context.Background(), dir, LoadOptions{})
		var le *LoadError
		if !errors.As(err, &le) || le.File != filepath.Join(dir, "a.cedar") || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("got %v", err)
		}
	})
}
