package cli

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

// TestVerifyChainListsStrayFiles: files and directories in an audit log
// that are not part of it (a segment copied aside, a name one digit too
// long, an epoch directory renamed) are not verified; verify-chain says so
// for each, in its report and in the JSON, and --strict fails on them (exit
// 10). What the writer itself leaves (.lock, a torn tail kept aside, an
// aborted epoch, the vault) is not listed.
func TestVerifyChainListsStrayFiles(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := filepath.Join(t.TempDir(), "log")
	var keyArgs []string
	for range 2 {
		keyArgs = append(keyArgs, "--key", writeTestLog(t, dir, key, 10).vkey)
	}
	seg := filepath.Join(dir, "epoch-000002", "seg-000001.jsonl")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	// What the writer leaves: not listed.
	for _, p := range []string{"epoch-000002/seg-000001.jsonl.torn-20260101T000000.000000000Z", "aborted-epoch-000003-20260101T000000.000000000Z/seg-000001.jsonl"} {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o700)
		os.WriteFile(filepath.Join(dir, p), []byte("x"), 0o600)
	}
	if code, out, errOut := runCLI(t, append([]string{"verify-chain", "--strict", dir}, keyArgs...)...); code != 0 || strings.Contains(out+errOut, "not part of the log") {
		t.Fatalf("a log with only the writer's own files: exit %d\n%s%s", code, out, errOut)
	}
	stray := []string{"epoch-000002/seg-000003.jsonl.bak", "epoch-000002/seg-000003 (copy).jsonl", "epoch-000002/seg-0000011.jsonl", "epoch-000002.old", "notes.txt"}
	for _, p := range stray[:3] {
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	os.CopyFS(filepath.Join(dir, "epoch-000002.old"), os.DirFS(filepath.Join(dir, "epoch-000002")))
	os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600)

	code, out, errOut := runCLI(t, append([]string{"verify-chain", dir}, keyArgs...)...)
	if code != 0 {
		t.Fatalf("without --strict: exit %d\n%s%s", code, out, errOut)
	}
	for _, p := range stray {
		if !strings.Contains(out+errOut, filepath.FromSlash(p)) {
			t.Errorf("%s is not listed:\n%s%s", p, out, errOut)
		}
	}
	code, out, _ = runCLI(t, append([]string{"verify-chain", "-o", "json", dir}, keyArgs...)...)
	var doc struct {
		Stray    []string `json:"stray"`
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 {
		t.Fatalf("json: exit %d %v\n%s", code, err, out)
	}
	want := slices.Clone(stray)
	slices.Sort(want)
	if !slices.Equal(doc.Stray, want) {
		t.Errorf("json stray = %q, want %q", doc.Stray, want)
	}
	if n := len(slices.DeleteFunc(slices.Clone(doc.Warnings), func(w string) bool { return !strings.Contains(w, "not part of the log") })); n != len(stray) {
		t.Errorf("%d warnings about stray entries in the JSON, want %d: %q", n, len(stray), doc.Warnings)
	}
	code, out, errOut = runCLI(t, append([]string{"verify-chain", "--strict", dir}, keyArgs...)...)
	if code != exitcode.ExitLogInteg || !strings.Contains(out+errOut, "not part of the log") || !strings.Contains(out+errOut, "seg-0000011.jsonl") {
		t.Fatalf("--strict: exit %d\n%s%s", code, out, errOut)
	}
}
