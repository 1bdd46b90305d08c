package cli

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// Unsigned records in the auditor's tools (found in review of the first
// fix): a forged result of a signed call, the JSON form, and bytes added to
// an epoch that a later one follows.

// snapshot copies an audit directory while its writer still runs: what a
// SIGKILL leaves on disk.
func snapshot(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "crashed")
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	os.Remove(filepath.Join(dst, ".lock"))
	return dst
}

// openRarelySigning opens a writer that signs only when asked (and at close).
func openRarelySigning(t *testing.T, dir string) *auditlog.Writer {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, CheckpointEvery: 1 << 30, CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestUnsignedResultOfASignedCall: a call covered by a checkpoint whose
// result record came after it; after a crash someone turns the result's
// is_error into ok. Replay marks the call UNSIGNED and --require-signed
// fails, before and after a restart, as verify-chain --require-signed does
// once the tail belongs to an earlier epoch.
func TestUnsignedResultOfASignedCall(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "audit")
	w := openRarelySigning(t, dir)
	w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "alice"})
	rc, err := w.Append(ctx, &record.Call{Session: "s1", Agent: "alice", Tool: "files__rm", Upstream: "files", EvidenceClass: "spawn-measured",
		Args: w.Commit([]byte(`{}`)), Decision: "allow", PolicyMode: "none", Outcome: record.OutcomeForwarded})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	w.Append(ctx, &record.Result{Call: rc.Index, Session: "s1", Outcome: record.ResultIsError, LatencyMicros: 10})
	crashed := snapshot(t, dir)
	w.Close()
	seg := filepath.Join(crashed, "epoch-000001", "seg-000001.jsonl")
	b, _ := os.ReadFile(seg)
	forged := strings.Replace(string(b), `"outcome":"is_error"`, `"outcome":"ok"`, 1)
	if forged == string(b) {
		t.Fatal("no result to forge")
	}
	os.WriteFile(seg, []byte(forged), 0o600)

	for _, stage := range []string{"newest epoch", "after restart"} {
		if stage == "after restart" {
			openRarelySigning(t, crashed).Close() // the next start's recovery
			if code, out, errs := runCLI(t, "verify-chain", crashed, "--require-signed"); code != exitcode.ExitLogSig {
				t.Fatalf("%s: verify-chain --require-signed exit %d\n%s%s", stage, code, out, errs)
			}
		}
		out, errs, code := run("replay", crashed)
		var row string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "files__rm") {
				row = l
			}
		}
		if code != 0 || !strings.Contains(row, "UNSIGNED") && !strings.Contains(row, "yes") {
			t.Fatalf("%s: replay exit %d, the call's row is not marked unsigned: %q\n%s%s", stage, code, row, out, errs)
		}
		if _, errs, code := run("replay", crashed, "--require-signed"); code != exitcode.ExitLogSig {
			t.Fatalf("%s: replay --require-signed exit %d\n%s", stage, code, errs)
		}
	}
}

// TestVerifyChainJSONListsUnsigned: the UNSIGNED ranges are in the JSON
// form too (an empty list when there are none).
func TestVerifyChainJSONListsUnsigned(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "audit")
	w := openRarelySigning(t, dir)
	w.Checkpoint()
	w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "alice"})
	crashed := snapshot(t, dir)
	w.Close()
	openRarelySigning(t, crashed).Close()
	code, out, _ := runCLI(t, "-o", "json", "verify-chain", crashed)
	var doc struct {
		Unsigned []auditlog.UnsignedRange `json:"unsigned"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 {
		t.Fatalf("exit %d, %v\n%s", code, err, out)
	}
	if want := (auditlog.UnsignedRange{Epoch: 1, First: 2, Last: 2, By: 2}); len(doc.Unsigned) != 1 || doc.Unsigned[0] != want {
		t.Fatalf("unsigned %+v, want [%+v]\n%s", doc.Unsigned, want, out)
	}
	_, out, _ = runCLI(t, "-o", "json", "verify-chain", dir)
	if !strings.Contains(out, `"unsigned": []`) {
		t.Fatalf("a log without unsigned records: %s", out)
	}
}

// TestTornBytesInAnEarlierEpochFail: the writer's recovery cuts an
// incomplete last line before it starts a new epoch, so one in an epoch
// that another follows was added afterwards.
func TestTornBytesInAnEarlierEpochFail(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "audit")
	w := openRarelySigning(t, dir)
	w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "alice"})
	crashed := snapshot(t, dir)
	w.Close()
	openRarelySigning(t, crashed).Close()
	seg := filepath.Join(crashed, "epoch-000001", "seg-000001.jsonl")
	f, _ := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"body":{"agent":"mallory"`)
	f.Close()
	code, out, errs := runCLI(t, "verify-chain", crashed)
	if code != exitcode.ExitLogInteg || !strings.Contains(errs, "epoch 1 ends with an incomplete line of 26 bytes, but epoch 2 follows it") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
}
