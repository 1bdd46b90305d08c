package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// testLog is a sealed audit log written through the library.
type testLog struct {
	dir  string
	key  ed25519.PrivateKey
	vkey string
}

func writeTestLog(t *testing.T, dir string, key ed25519.PrivateKey, calls int) *testLog {
	t.Helper()
	// interval: these logs test the verifier, not durability; keep them fast.
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, CheckpointEvery: 50, Durability: record.DurabilityInterval})
	if err != nil {
		t.Fatal(err)
	}
	for i := range calls {
		c := &record.Call{Session: "s1", Agent: "agent-a", Tool: "fs__read", Upstream: "fs", EvidenceClass: "spawn-measured",
			Args: w.Commit([]byte(fmt.Sprintf(`{"path":"/srv/%d"}`, i))), Decision: record.DecisionAllow, PolicyMode: "enforcing",
			PolicyBundle: digest.Bytes([]byte("bundle")), Outcome: record.OutcomeForwarded}
		if _, err := w.Append(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return &testLog{dir: dir, key: key, vkey: w.VerifierKey()}
}

// base writes a fresh 300-call log and saves its newest checkpoint.
func base(t *testing.T) (*testLog, string) {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	d := t.TempDir()
	l := writeTestLog(t, filepath.Join(d, "log"), key, 300)
	saved := filepath.Join(d, "saved.cp")
	if code, _, stderr := runCLI(t, "verify-chain", l.dir, "--key", l.vkey, "--save-checkpoint", saved); code != 0 {
		t.Fatalf("base log does not verify: %s", stderr)
	}
	return l, saved
}

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, strings.NewReader(""), &out, &errb)
	if err := checkJSONOutput(args, out.Bytes()); err != nil {
		t.Error(err)
	}
	if wd, err := os.Getwd(); err == nil {
		if err := checkWrittenFiles(args, wd, code); err != nil {
			t.Error(err)
		}
	}
	return code, out.String(), errb.String()
}

func segPath(l *testLog) string { return filepath.Join(l.dir, "epoch-000001", "seg-000001.jsonl") }

func readLines(t *testing.T, p string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.Split(b, []byte("\n"))
}

func writeLines(t *testing.T, p string, lines [][]byte) {
	t.Helper()
	if err := os.WriteFile(p, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
}

func kindOf(line []byte) string {
	var m struct {
		Kind string `json:"kind"`
	}
	json.Unmarshal(line, &m)
	return m.Kind
}

// firstCheckpointAfter returns the index of the first checkpoint line at or after i.
func firstCheckpointAfter(lines [][]byte, i int) int {
	for ; i < len(lines); i++ {
		if kindOf(lines[i]) == "checkpoint" {
			return i
		}
	}
	return -1
}

// rechain rewrites lines[from:] so that every link and checkpoint is valid
// again, signing checkpoints with key: what a key holder rewriting history
// (or anyone, for the unsigned tail) can do.
func rechain(t *testing.T, lines [][]byte, from int, key ed25519.PrivateKey) {
	t.Helper()
	var g struct {
		Body struct {
			Origin string `json:"origin"`
		} `json:"body"`
	}
	if err := json.Unmarshal(lines[0], &g); err != nil {
		t.Fatal(err)
	}
	signer, _, err := c2sp.NewNoteKeys(g.Body.Origin, key)
	if err != nil {
		t.Fatal(err)
	}
	var stored []tlog.Hash
	hr := tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			out[i] = stored[x]
		}
		return out, nil
	})
	for i := range lines {
		if i >= from && i > 0 {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(lines[i], &m); err != nil {
				t.Fatal(err)
			}
			prev := tlog.RecordHash(lines[i-1])
			m["prev"], _ = json.Marshal(base64.StdEncoding.EncodeToString(prev[:]))
			if kindOf(lines[i]) == "checkpoint" {
				root, err := tlog.TreeHash(int64(i), hr)
				if err != nil {
					t.Fatal(err)
				}
				text := fmt.Sprintf("%s\n%d\n%s\n", g.Body.Origin, i, base64.StdEncoding.EncodeToString(root[:]))
				msg, err := note.Sign(&note.Note{Text: text}, signer)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := json.Marshal(map[string]string{"note": string(msg)})
				m["body"] = body
			}
			raw, _ := json.Marshal(m)
			if lines[i], err = digest.Canonicalize(raw); err != nil {
				t.Fatal(err)
			}
		}
		hs, err := tlog.StoredHashes(int64(i), lines[i], hr)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, hs...)
	}
}

func replaceOnce(t *testing.T, line []byte, old, new string) []byte {
	t.Helper()
	if !bytes.Contains(line, []byte(old)) {
		t.Fatalf("%q not in line %s", old, line)
	}
	return bytes.Replace(line, []byte(old), []byte(new), 1)
}

func TestVerifyChainTamperMatrix(t *testing.T) {
	type tc struct {
		name     string
		mutate   func(t *testing.T, l *testLog, lines [][]byte) [][]byte
		saved    bool // pass the checkpoint saved from the intact log
		noKey    bool
		wantCode int
		want     []string // substrings of stdout+stderr
	}
	tests := []tc{
		{"intact", nil, true, false, exitcode.ExitOK, []string{"VERIFIED", "consistent with the saved checkpoint"}},
		{"byte flipped in a record", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			ls[100] = replaceOnce(t, ls[100], "fs__read", "fs__reae")
			return ls
		}, false, false, exitcode.ExitLogInteg, []string{"FAIL integrity", "record:    101 (call)", "line:      102", "offset:    byte ", "record 100 was modified", "expected:", "computed:"}},
		{"byte flipped in a checkpoint", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			i := firstCheckpointAfter(ls, 100)
			var n struct {
				Body struct{ Note string } `json:"body"`
			}
			json.Unmarshal(ls[i], &n)
			root := strings.Split(n.Body.Note, "\n")[2]
			// Another base64 letter, so that the note still parses and
			// only the signature can catch it.
			c := byte('A')
			if root[0] == 'A' {
				c = 'B'
			}
			flipped := string(c) + root[1:]
			ls[i] = replaceOnce(t, ls[i], root, flipped)
			return ls
		}, false, false, exitcode.ExitLogSig, []string{"FAIL signature", "(checkpoint)", "signature does not verify"}},
		{"byte flipped in a signature", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			i := firstCheckpointAfter(ls, 100)
			j := bytes.LastIndex(ls[i], []byte(`\n"}`)) - 10
			c := ls[i][j]
			if c == 'A' {
				ls[i][j] = 'B'
			} else {
				ls[i][j] = 'A'
			}
			return ls
		}, false, false, exitcode.ExitLogSig, []string{"FAIL signature", "(checkpoint)"}},
		{"record deleted", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			return append(ls[:100:100], ls[101:]...)
		}, false, false, exitcode.ExitLogInteg, []string{"sequence number 101, expected 100", "line:      101"}},
		{"record duplicated", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			out := append([][]byte{}, ls[:101]...)
			out = append(out, ls[100])
			return append(out, ls[101:]...)
		}, false, false, exitcode.ExitLogInteg, []string{"sequence number 100, expected 101", "line:      102"}},
		{"records swapped", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			ls[100], ls[101] = ls[101], ls[100]
			return ls
		}, false, false, exitcode.ExitLogInteg, []string{"sequence number 101, expected 100"}},
		{"line made non-canonical", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			ls[100] = replaceOnce(t, ls[100], `"agent":`, `"agent": `)
			return ls
		}, false, false, exitcode.ExitLogInteg, []string{"not in RFC 8785 canonical form", "record:    100", "line:      101"}},
		{"duplicate JSON keys", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			ls[100] = replaceOnce(t, ls[100], `"agent":"agent-a"`, `"agent":"agent-a","agent":"agent-b"`)
			return ls
		}, false, false, exitcode.ExitLogInteg, []string{`duplicate object member name "agent"`, "record:    100"}},
		{"invalid UTF-8", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			ls[100] = replaceOnce(t, ls[100], "agent-a", "agent-\xff")
			return ls
		}, false, false, exitcode.ExitLogInteg, []string{"invalid UTF-8", "record:    100"}},
		{"line of several megabytes", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			ls[100] = replaceOnce(t, ls[100], "agent-a", strings.Repeat("A", 6<<20))
			return ls
		}, false, false, exitcode.ExitLogInteg, []string{"longer than", "line:      101"}},
		{"log rewritten with another key", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			_, other, _ := ed25519.GenerateKey(rand.Reader)
			forged := writeTestLog(t, filepath.Join(t.TempDir(), "forged"), other, 300)
			return readLines(t, segPath(forged))
		}, false, false, exitcode.ExitLogKey, []string{"FAIL key", "not among the trusted keys", "record:    0 (genesis)"}},
		{"checkpoints re-signed with another key", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			_, other, _ := ed25519.GenerateKey(rand.Reader)
			ls[100] = replaceOnce(t, ls[100], "fs__read", "fs__rm")
			rechain(t, ls, 100, other)
			return ls
		}, false, false, exitcode.ExitLogKey, []string{"FAIL key", "not signed by the epoch's key"}},
		{"truncated, no external checkpoint", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			return ls[:200]
		}, false, false, exitcode.ExitOK, []string{"truncation of the tail cannot be detected", "unsealed tail: 45 records", "not sealed"}},
		{"truncated, against a saved checkpoint", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			return ls[:200]
		}, true, false, exitcode.ExitLogTrunc, []string{"FAIL truncation", "has 200 records but the saved checkpoint commits to"}},
		{"history regenerated with the real key, no external checkpoint", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			ls[100] = replaceOnce(t, ls[100], `"decision":"allow"`, `"decision":"deny"`)
			rechain(t, ls, 100, l.key)
			return ls
		}, false, false, exitcode.ExitOK, []string{"VERIFIED", "truncation of the tail cannot be detected"}},
		{"history regenerated with the real key, against a saved checkpoint", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			ls[100] = replaceOnce(t, ls[100], `"decision":"allow"`, `"decision":"deny"`)
			rechain(t, ls, 100, l.key)
			return ls
		}, true, false, exitcode.ExitLogFork, []string{"FAIL fork", "SECURITY ERROR", "saved checkpoint:"}},
		{"records appended after the seal", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			n := len(ls)
			ls = append(ls, bytes.Replace(ls[100], []byte(`"seq":"100"`), []byte(`"seq":"`+strconv.Itoa(n)+`"`), 1))
			rechain(t, ls, n, l.key)
			return ls
		}, true, false, exitcode.ExitLogInteg, []string{"FAIL integrity", "after the epoch's seal"}},
		{"records appended after the last checkpoint", func(t *testing.T, l *testLog, ls [][]byte) [][]byte {
			if kindOf(ls[len(ls)-2]) != "seal" {
				t.Fatal("the base log is not sealed")
			}
			ls = ls[:len(ls)-2] // as a gateway that crashed left it
			n := len(ls)
			for i := range 3 {
				ls = append(ls, bytes.Replace(ls[100], []byte(`"seq":"100"`), []byte(`"seq":"`+strconv.Itoa(n+i)+`"`), 1))
			}
			rechain(t, ls, n, l.key)
			return ls
		}, false, false, exitcode.ExitOK, []string{"unsealed tail: 3 records", "not covered by any signature", "not sealed"}},
		{"no key given", nil, false, true, exitcode.ExitOK, []string{"trust not established"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, saved := base(t)
			if tt.mutate != nil {
				writeLines(t, segPath(l), tt.mutate(t, l, readLines(t, segPath(l))))
			}
			args := []string{"verify-chain", l.dir}
			if !tt.noKey {
				args = append(args, "--key", l.vkey)
			}
			if tt.saved {
				args = append(args, "--checkpoint", saved)
			}
			code, out, errOut := runCLI(t, args...)
			all := out + errOut
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d\n%s", code, tt.wantCode, all)
			}
			for _, w := range tt.want {
				if !strings.Contains(all, w) {
					t.Errorf("output lacks %q:\n%s", w, all)
				}
			}
			// The JSON form carries the same verdict and location.
			code2, jout, _ := runCLI(t, append(args, "-o", "json")...)
			var doc verifyChainDoc
			if err := json.Unmarshal([]byte(jout), &doc); err != nil || code2 != code || doc.ExitCode != code {
				t.Fatalf("json: exit %d, doc exit %d, err %v\n%s", code2, doc.ExitCode, err, jout)
			}
			if (code == 0) != (doc.Status == "verified") || code != 0 && doc.Failure == nil {
				t.Fatalf("json status %q failure %v", doc.Status, doc.Failure)
			}
		})
	}
}

func TestVerifyChainEpochs(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := filepath.Join(t.TempDir(), "log")
	var vkeys []string
	for range 3 {
		vkeys = append(vkeys, writeTestLog(t, dir, key, 20).vkey)
	}
	keyArgs := []string{"--key", vkeys[0], "--key", vkeys[1], "--key", vkeys[2]}
	cp := filepath.Join(t.TempDir(), "saved.cp")
	if code, out, errOut := runCLI(t, append([]string{"verify-chain", dir, "--save-checkpoint", cp}, keyArgs...)...); code != 0 || !strings.Contains(out, "epoch chain") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	t.Run("middle epoch deleted", func(t *testing.T) {
		d := filepath.Join(t.TempDir(), "log")
		os.CopyFS(d, os.DirFS(dir))
		os.RemoveAll(filepath.Join(d, "epoch-000002"))
		code, out, errOut := runCLI(t, append([]string{"verify-chain", d}, keyArgs...)...)
		if code != exitcode.ExitLogTrunc || !strings.Contains(out+errOut, "epoch 2 is missing") {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("newest epoch deleted, against a saved checkpoint", func(t *testing.T) {
		d := filepath.Join(t.TempDir(), "log")
		os.CopyFS(d, os.DirFS(dir))
		os.RemoveAll(filepath.Join(d, "epoch-000003"))
		code, out, errOut := runCLI(t, append([]string{"verify-chain", d, "--checkpoint", cp}, keyArgs...)...)
		if code != exitcode.ExitLogTrunc || !strings.Contains(out+errOut, "no epoch of this log has that origin") {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("first epoch deleted", func(t *testing.T) {
		d := filepath.Join(t.TempDir(), "log")
		os.CopyFS(d, os.DirFS(dir))
		os.RemoveAll(filepath.Join(d, "epoch-000001"))
		code, out, errOut := runCLI(t, append([]string{"verify-chain", d}, keyArgs...)...)
		if code != exitcode.ExitLogTrunc || !strings.Contains(out+errOut, "earlier epochs were deleted") {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("old epoch extended after it ended", func(t *testing.T) {
		d := filepath.Join(t.TempDir(), "log")
		os.CopyFS(d, os.DirFS(dir))
		p := filepath.Join(d, "epoch-000001", "seg-000001.jsonl")
		ls := readLines(t, p)
		n := len(ls)
		ls = append(ls, bytes.Replace(ls[5], []byte(`"seq":"5"`), []byte(`"seq":"`+strconv.Itoa(n)+`"`), 1))
		rechain(t, ls, n, key)
		writeLines(t, p, ls)
		code, out, errOut := runCLI(t, append([]string{"verify-chain", d}, keyArgs...)...)
		if code != exitcode.ExitLogInteg || !strings.Contains(out+errOut, "after the epoch's seal") {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
	})
}

func TestVerifyChainBadInput(t *testing.T) {
	l, _ := base(t)
	tests := []struct {
		name     string
		dir      func(t *testing.T) string
		wantCode int
		want     string
	}{
		{"empty directory", func(t *testing.T) string { return t.TempDir() }, exitcode.ExitUsage, "not an audit log"},
		{"not a log", func(t *testing.T) string {
			d := t.TempDir()
			os.WriteFile(filepath.Join(d, "notes.txt"), []byte("hello\n"), 0o644)
			return d
		}, exitcode.ExitUsage, "not an audit log"},
		{"missing directory", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") }, exitcode.ExitIO, "no such file"},
		{"a file, not a directory", func(t *testing.T) string { return segPath(l) }, exitcode.ExitUsage, "is not a directory"},
		{"segment replaced by a directory", func(t *testing.T) string {
			l2, _ := base(t)
			os.Remove(segPath(l2))
			os.Mkdir(segPath(l2), 0o700)
			return l2.dir
		}, exitcode.ExitIO, "not a regular file"},
		{"segment missing", func(t *testing.T) string {
			l2, _ := base(t)
			os.Remove(segPath(l2))
			return l2.dir
		}, exitcode.ExitLogInteg, "holds no segment files"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "verify-chain", tt.dir(t), "--key", l.vkey)
			if code != tt.wantCode || !strings.Contains(out+errOut, tt.want) {
				t.Fatalf("exit %d (want %d), want %q in\n%s%s", code, tt.wantCode, tt.want, out, errOut)
			}
		})
	}
	t.Run("bad key", func(t *testing.T) {
		code, _, errOut := runCLI(t, "verify-chain", l.dir, "--key", "nonsense")
		if code != exitcode.ExitUsage || !strings.Contains(errOut, "not a note verifier key") {
			t.Fatalf("exit %d\n%s", code, errOut)
		}
	})
	t.Run("no arguments", func(t *testing.T) {
		if code, _, _ := runCLI(t, "verify-chain"); code != exitcode.ExitUsage {
			t.Fatalf("exit %d", code)
		}
	})
}

// TestVerifyChainPermissionDenied runs the verifier as an unprivileged user
// in a child process: as root, file permissions are not enforced, so the
// only honest way to see EACCES is to drop privileges.
func TestVerifyChainPermissionDenied(t *testing.T) {
	l, _ := base(t)
	parent, err := os.MkdirTemp("", "cmcp-perm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(parent)
	os.Chmod(parent, 0o755)
	d := filepath.Join(parent, "log")
	if err := os.CopyFS(d, os.DirFS(l.dir)); err != nil {
		t.Fatal(err)
	}
	filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
		if fi.IsDir() {
			os.Chmod(p, 0o755)
		} else {
			os.Chmod(p, 0o644)
		}
		return nil
	})
	os.Chmod(filepath.Join(d, "epoch-000001", "seg-000001.jsonl"), 0)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Copy the test binary where the unprivileged user can execute it.
	exe := filepath.Join(parent, "cli.test")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "verify-chain", d, "--key", l.vkey)
	cmd.Env = append(os.Environ(), "CMCP_CLI_CHILD=1") // TestMain runs cli.Main
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	err = cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if strings.Contains(out.String(), "fork/exec") || code == -1 {
		t.Fatalf("could not start the unprivileged child: %v %s", err, out.String())
	}
	if code != exitcode.ExitIO || !strings.Contains(out.String(), "permission denied") {
		t.Fatalf("exit %d, want %d with 'permission denied':\n%s", code, exitcode.ExitIO, out.String())
	}
}

func TestVerifyChainProofs(t *testing.T) {
	l, _ := base(t)
	code, proof, errOut := runCLI(t, "verify-chain", l.dir, "--key", l.vkey, "--prove", "100")
	if code != 0 || !strings.HasPrefix(proof, "c2sp.org/tlog-proof@v1\nextra ") {
		t.Fatalf("prove: exit %d\n%s%s", code, proof, errOut)
	}
	pf := filepath.Join(t.TempDir(), "r100.proof")
	os.WriteFile(pf, []byte(proof), 0o644)
	code, out, errOut := runCLI(t, "verify-chain", "--proof", pf, "--key", l.vkey)
	if code != 0 || !strings.Contains(out, "record 100 (call) is included") {
		t.Fatalf("proof: exit %d\n%s%s", code, out, errOut)
	}
	// A changed record inside the proof.
	lines := strings.Split(proof, "\n")
	rec, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(lines[1], "extra "))
	rec = bytes.Replace(rec, []byte(`"decision":"allow"`), []byte(`"decision":"deny"`), 1)
	lines[1] = "extra " + base64.StdEncoding.EncodeToString(rec)
	bad := filepath.Join(t.TempDir(), "bad.proof")
	os.WriteFile(bad, []byte(strings.Join(lines, "\n")), 0o644)
	if code, out, errOut := runCLI(t, "verify-chain", "--proof", bad, "--key", l.vkey); code != exitcode.ExitLogInteg || !strings.Contains(out+errOut, "inclusion proof does not verify") {
		t.Fatalf("tampered proof: exit %d\n%s%s", code, out, errOut)
	}
	// For programs (runCLI checks each document against docs/schema):
	// the proof, its check verified and failed, and a fleet of two logs.
	if code, _, errOut := runCLI(t, "-o", "json", "verify-chain", l.dir, "--key", l.vkey, "--prove", "100"); code != 0 {
		t.Fatalf("prove -o json: exit %d\n%s", code, errOut)
	}
	if code, out, errOut := runCLI(t, "-o", "json", "verify-chain", "--proof", pf, "--key", l.vkey); code != 0 || !strings.Contains(out, `"status": "verified"`) {
		t.Fatalf("proof -o json: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, "-o", "json", "verify-chain", "--proof", bad, "--key", l.vkey); code != exitcode.ExitLogInteg || !strings.Contains(out, `"status": "failed"`) {
		t.Fatalf("tampered proof -o json: exit %d\n%s%s", code, out, errOut)
	}
	l2, _ := base(t)
	if code, out, errOut := runCLI(t, "-o", "json", "verify-chain", l.dir, l2.dir, "--key", l.vkey, "--key", l2.vkey); code != 0 || !strings.Contains(out, `"gateways"`) {
		t.Fatalf("fleet -o json: exit %d\n%s%s", code, out, errOut)
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	vk, _ := note.NewEd25519VerifierKey("someone-else", other.Public().(ed25519.PublicKey))
	if code, _, errOut := runCLI(t, "verify-chain", "--proof", pf, "--key", vk); code != exitcode.ExitLogKey {
		t.Fatalf("foreign key: exit %d\n%s", code, errOut)
	}
	if code, _, _ := runCLI(t, "verify-chain", "--proof", pf); code != exitcode.ExitUsage {
		t.Fatalf("no key: exit %d", code)
	}
	// A record in the unsealed tail cannot be proved yet.
	ls := readLines(t, segPath(l))
	writeLines(t, segPath(l), ls[:len(ls)-2])
	if code, _, errOut := runCLI(t, "verify-chain", l.dir, "--key", l.vkey, "--prove", strconv.Itoa(len(ls)-3)); code != exitcode.ExitUsage || !strings.Contains(errOut, "unsealed tail") {
		t.Fatalf("unsealed: exit %d\n%s", code, errOut)
	}
	_ = sha256.Sum256
}

func TestVerifyChainSegment(t *testing.T) {
	dir, key := segmentLog(t)
	seg := filepath.Join(dir, "epoch-000001", "seg-000002.jsonl")
	code, out, errOut := runCLI(t, "verify-chain", "--segment", seg, "--key", key)
	if code != 0 || !strings.Contains(out, "Verified segment") || !strings.Contains(out, "unsealed tail: none") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	ls := readLines(t, seg)
	ls[3] = replaceOnce(t, ls[3], `"agent":"a"`, `"agent":"b"`)
	writeLines(t, seg, ls)
	code, out, errOut = runCLI(t, "verify-chain", "--segment", seg, "--key", key)
	if code != exitcode.ExitLogInteg || !strings.Contains(out, "line:      5") {
		t.Fatalf("tampered segment: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, _ := runCLI(t, "verify-chain", "--segment", seg); code != exitcode.ExitUsage {
		t.Fatalf("no key: exit %d", code)
	}
}
