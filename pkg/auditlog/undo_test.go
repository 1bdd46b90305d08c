//go:build linux

package auditlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// fileSizeChildEnv makes the test binary the child process of
// runFileSizeChild; it holds a fileSizeChild as JSON. The tests that need
// a full disk lower RLIMIT_FSIZE only there: the limit holds for the whole
// process, so in the test process itself it would also fail every other
// file write made while it is lowered (the test log that go test has the
// testing package write during a cacheable run, coverage files, the files
// of tests running in parallel).
const fileSizeChildEnv = "CMCP_AUDIT_FSIZE_CHILD"

// fileSizeChild is what the parent tells its child process.
type fileSizeChild struct {
	Dir       string // the audit directory, which the parent checks after the child
	Recipient string // the vault's age recipient; the parent holds the identity
	Result    string // the file the child writes its result to, as JSON
}

// asFileSizeChild reports whether this process is the child of a
// runFileSizeChild call, and what its parent told it.
func asFileSizeChild(t *testing.T) (fileSizeChild, bool) {
	t.Helper()
	s := os.Getenv(fileSizeChildEnv)
	if s == "" {
		return fileSizeChild{}, false
	}
	var c fileSizeChild
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		t.Fatalf("%s: %v", fileSizeChildEnv, err)
	}
	return c, true
}

// runFileSizeChild runs the current subtest again in a child process (the
// test binary, told to run only t.Name()) with c in its environment, and
// decodes the result the child reported into res. A child that fails or
// reports nothing fails t, with the child's output.
func runFileSizeChild(t *testing.T, c fileSizeChild, res any) {
	t.Helper()
	c.Result = filepath.Join(t.TempDir(), "result.json")
	env, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var run []string
	for _, name := range strings.Split(t.Name(), "/") {
		run = append(run, "^"+regexp.QuoteMeta(name)+"$")
	}
	cmd := exec.Command(exe, "-test.run="+strings.Join(run, "/"), "-test.v", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), fileSizeChildEnv+"="+string(env))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child process: %v\n%s", err, out)
	}
	b, err := os.ReadFile(c.Result)
	if err != nil {
		t.Fatalf("the child process reported no result: %v\n%s", err, out)
	}
	if err := json.Unmarshal(b, res); err != nil {
		t.Fatalf("the child process's result: %v", err)
	}
}

// report writes the child's result for its parent.
func (c fileSizeChild) report(t *testing.T, res any) {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.Result, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// withFileSizeLimit runs f with RLIMIT_FSIZE lowered to limit bytes: a
// write that would grow a file beyond it writes what fits and fails with
// EFBIG, as a write on a disk that fills part way does (Go ignores the
// SIGXFSZ that comes with it). Only a child process of runFileSizeChild
// may lower the limit.
func withFileSizeLimit(t *testing.T, limit int64, f func()) {
	t.Helper()
	if os.Getenv(fileSizeChildEnv) == "" {
		t.Fatal("withFileSizeLimit in the test process itself: lower the file size limit only in a child process (runFileSizeChild)")
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lim := syscall.Rlimit{Cur: uint64(limit), Max: old.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old)
	f()
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// failedBatch is what the child process of TestFailedBatchLeavesNoRecord
// saw.
type failedBatch struct {
	Seg, Vault           int64             // the segment's and the vault's size before the failed append
	SegAfter, VaultAfter int64             // and right after it
	First                record.Commitment // the arguments of the call whose append succeeded
	Err                  string            // the failed append's error
	Fatal, EFBIG         bool              // whether that is a *FatalError and wraps EFBIG
	Next                 string            // the error of the append after the failed one
	NextSame             bool              // whether that is the failed append's error
}

// failBatch is the child process of TestFailedBatchLeavesNoRecord: it
// appends one call, then a second one with the file size limit set inside
// the batch the second append writes, then a third, and reports.
func failBatch(t *testing.T, c fileSizeChild, vault bool, limitOf func(seg, vault, line int64) int64) {
	w, err := Open(c.Dir, Options{Key: logtest.Key(t), CheckpointEvery: 2, CheckpointInterval: 1 << 40,
		Recipients: []string{c.Recipient}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	first := logtest.SampleCall(w, 1)
	if _, err := w.Append(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	segPath := filepath.Join(c.Dir, "epoch-000001", "seg-000001.jsonl")
	vaultPath := filepath.Join(c.Dir, "epoch-000001", VaultFile)
	b, err := os.ReadFile(segPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	res := failedBatch{Seg: int64(len(b)), Vault: fileSize(t, vaultPath), First: first.Args}
	limit := limitOf(res.Seg, res.Vault, int64(len(lines[len(lines)-2])))
	if limit <= res.Vault || vault != (limit < res.Seg) {
		t.Fatalf("limit %d does not fall inside the batch (segment %d, vault %d bytes)", limit, res.Seg, res.Vault)
	}
	var appendErr error
	withFileSizeLimit(t, limit, func() {
		_, appendErr = w.Append(context.Background(), logtest.SampleCall(w, 2))
	})
	var fe *FatalError
	res.Err, res.Fatal, res.EFBIG = fmt.Sprint(appendErr), errors.As(appendErr, &fe), errors.Is(appendErr, syscall.EFBIG)
	res.SegAfter, res.VaultAfter = fileSize(t, segPath), fileSize(t, vaultPath)
	_, err = w.Append(context.Background(), logtest.SampleCall(w, 3))
	res.Next, res.NextSame = fmt.Sprint(err), err == appendErr
	w.Close()
	c.report(t, res)
}

// TestFailedBatchLeavesNoRecord: a batch whose write fails part way (the
// disk fills inside it: here the call record fits and the checkpoint that
// closes the batch does not; or the vault entry written before it does not
// fit) is cut off the segment and the vault again, so an Append that
// reports an error did not write its record: after a restart the log holds
// no call record for it (recovery keeps every complete line, so a call the
// gateway refused would otherwise read as forwarded), recovery has nothing
// to cut, the vault has no torn line and the log verifies. The writer runs
// in a child process (failBatch), which lowers the file size limit.
func TestFailedBatchLeavesNoRecord(t *testing.T) {
	for _, tc := range []struct {
		name  string
		vault bool // the vault write fails, not the segment's
		// limit returns the file size limit given the segment's and the
		// vault's size and the length of the last segment line.
		limit func(seg, vault, line int64) int64
	}{
		{"segment fills inside the batch", false, func(seg, vault, line int64) int64 { return seg + line + 40 }},
		{"vault fills inside its entry", true, func(seg, vault, line int64) int64 { return vault + 40 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c, ok := asFileSizeChild(t); ok {
				failBatch(t, c, tc.vault, tc.limit)
				return
			}
			id, err := age.GenerateX25519Identity()
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			var res failedBatch
			runFileSizeChild(t, fileSizeChild{Dir: dir, Recipient: id.Recipient().String()}, &res)
			if !res.Fatal || !res.EFBIG {
				t.Fatalf("append past the size limit: %s", res.Err)
			}
			if strings.Contains(res.Err, "failed too") {
				t.Fatalf("the cut failed: %s", res.Err)
			}
			if res.SegAfter != res.Seg {
				t.Errorf("segment is %d bytes after the failed append, was %d before it", res.SegAfter, res.Seg)
			}
			if res.VaultAfter != res.Vault {
				t.Errorf("vault is %d bytes after the failed append, was %d before it", res.VaultAfter, res.Vault)
			}
			if !res.NextSame {
				t.Fatalf("append after the failed one: %s", res.Next)
			}

			w2, err := Open(dir, Options{Key: logtest.Key(t)})
			if err != nil {
				t.Fatal(err)
			}
			if rec := w2.Recovery(); rec == nil || rec.DroppedBytes != 0 {
				t.Errorf("recovery %+v, want one that cuts nothing", rec)
			}
			if err := w2.Close(); err != nil {
				t.Fatal(err)
			}
			r, err := NewReader(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			calls := 0
			for {
				e, err := r.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if rec, err := e.Decode(); err == nil {
					if _, ok := rec.(*record.Call); ok {
						calls++
					}
				}
			}
			if calls != 1 {
				t.Fatalf("the log holds %d call records after recovery; only 1 Append succeeded", calls)
			}
			rep, err := Verify(dir, VerifyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			o, err := NewOpener(rep.Epochs[0].Genesis, id)
			if err != nil {
				t.Fatal(err)
			}
			if err := o.LoadVault(filepath.Join(dir, "epoch-000001"), id); err != nil {
				t.Fatal(err)
			}
			if n := o.VaultTorn(); n != 0 {
				t.Errorf("the vault ends with a torn line of %d bytes", n)
			}
			if _, err := o.Payload(res.First); err != nil {
				t.Errorf("the acknowledged call's payload: %v", err)
			}
		})
	}
}

// TestFailedSyncCutFailureIsReported: when the fdatasync after a full write
// fails and the batch cannot be cut off either (here the segment's
// descriptor refers to /dev/null, which takes the write and refuses both
// fdatasync and truncation), the writer stops with an error that says the
// failed batch may remain in the log, so the operator knows what the next
// start's recovery cannot tell.
func TestFailedSyncCutFailureIsReported(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if err := syscall.Dup2(int(null.Fd()), int(w.f.Fd())); err != nil {
		t.Fatal(err)
	}
	_, err = w.Append(context.Background(), logtest.SampleCall(w, 0))
	var fe *FatalError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "fdatasync") || !strings.Contains(err.Error(), "records whose append failed may remain") {
		t.Fatalf("append whose sync and cut fail: %v", err)
	}
	if err := w.Close(); !errors.As(err, &fe) {
		t.Fatalf("close: %v", err)
	}
}

// failedStart is what the child process of TestFailedStartLeavesNoEpoch
// saw: the error of an Open with the file size limit at 100 bytes.
type failedStart struct {
	Err   string
	EFBIG bool // whether it wraps EFBIG
}

// TestFailedStartLeavesNoEpoch: an Open whose genesis record cannot be
// written (the disk is full) fails and removes the epoch directory it
// created, segment and vault included, so the log is as it was before the
// attempt: it verifies, and the next start continues the chain without an
// aborted epoch to move aside. The Open runs in a child process, which
// lowers the file size limit.
func TestFailedStartLeavesNoEpoch(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		before int // epochs written before the failed start
		vault  bool
	}{
		{"first start", 0, false},
		{"after a sealed epoch", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c, ok := asFileSizeChild(t); ok {
				opts := Options{Key: logtest.Key(t)}
				if tc.vault {
					opts.Recipients, opts.Vault = []string{id.Recipient().String()}, true
				}
				var openErr error
				withFileSizeLimit(t, 100, func() {
					var w *Writer
					if w, openErr = Open(c.Dir, opts); openErr == nil {
						w.Close()
					}
				})
				c.report(t, failedStart{Err: fmt.Sprint(openErr), EFBIG: errors.Is(openErr, syscall.EFBIG)})
				return
			}
			dir := t.TempDir()
			if tc.before > 0 {
				writeLog(t, dir, Options{}, 10, 1)
			}
			var res failedStart
			runFileSizeChild(t, fileSizeChild{Dir: dir}, &res)
			if !res.EFBIG {
				t.Fatalf("open on a full disk: %s", res.Err)
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range ents {
				if e.Name() != ".lock" {
					names = append(names, e.Name())
				}
			}
			if want := tc.before; len(names) != want {
				t.Fatalf("audit directory holds %v after the failed start, want %d epoch(s)", names, want)
			}
			if tc.before > 0 {
				if _, err := Verify(dir, VerifyOptions{}); err != nil {
					t.Fatalf("verify after the failed start: %v", err)
				}
			}
			w, err := Open(dir, Options{Key: logtest.Key(t)})
			if err != nil {
				t.Fatal(err)
			}
			if e, _ := w.Epoch(); e != tc.before+1 || w.Recovery() != nil {
				t.Fatalf("next start: epoch %d (want %d), recovery %+v", e, tc.before+1, w.Recovery())
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if m, _ := filepath.Glob(filepath.Join(dir, "aborted-*")); len(m) != 0 {
				t.Fatalf("aborted epochs %v", m)
			}
			if _, err := Verify(dir, VerifyOptions{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
