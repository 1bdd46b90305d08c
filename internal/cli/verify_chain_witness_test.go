//go:build peers

package cli

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/witness"
	"github.com/confidential-mcp/cmcp/internal/witness/litewitness"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// witnessedLog writes two epochs of a log with a stable log identity whose
// checkpoints a real litewitness cosigns, and returns the directory and
// the witness.
func witnessedLog(t *testing.T) (string, *litewitness.Server) {
	t.Helper()
	lw := litewitness.Start(t, "w1.example/lw")
	return witnessedLogAt(t, lw, "example.com/gw1"), lw
}

// witnessedLogAt writes a log of origin that lw witnesses.
func witnessedLogAt(t *testing.T, lw *litewitness.Server, origin string) string {
	t.Helper()
	_, logKey, _ := ed25519.GenerateKey(rand.Reader)
	_, vkey, _ := c2sp.NewNoteKeys(origin, logKey)
	lw.AddLog(origin, vkey)
	dir := filepath.Join(t.TempDir(), "audit")
	for range 2 {
		c, err := witness.New(witness.Config{Witnesses: []witness.Witness{{URL: lw.URL, Key: lw.Vkey}}, LogKey: vkey, AuditDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		w, err := auditlog.Open(dir, auditlog.Options{Key: k, Name: "example.com/audit", Log: &auditlog.LogIdentity{Origin: origin, Key: logKey, OnCheckpoint: c.Submit}})
		if err != nil {
			t.Fatal(err)
		}
		base, fr := w.LogBase()
		_, ed := w.Epoch()
		if err := c.Attach(ed, base, fr); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if _, err := w.Append(context.Background(), &record.Session{ID: fmt.Sprint(i), Event: "start", Agent: "a"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = c.Close(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestVerifyChainWitnessed: verify-chain --witness verifies a log with no
// saved checkpoint, says WITNESSED (human) and tail_protected_by witnesses
// (JSON), and drops the truncation warning; a quorum it does not meet
// exits 13; a witness key of the wrong type is a usage error.
func TestVerifyChainWitnessed(t *testing.T) {
	dir, lw := witnessedLog(t)
	code, out, errOut := runCLI(t, "verify-chain", dir, "--witness", lw.Vkey, "--witness-quorum", "1")
	if code != 0 || !strings.Contains(out, "WITNESSED: the newest checkpoint (log size ") || !strings.Contains(out, "cosigned by w1.example/lw (quorum 1)") ||
		!strings.Contains(out, "truncation and forks of the tail are detected without a saved checkpoint") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if strings.Contains(out, "truncation of the tail cannot be detected") {
		t.Fatalf("the truncation warning is still there:\n%s", out)
	}
	code, out, errOut = runCLI(t, "verify-chain", "-o", "json", dir, "--witness", lw.Vkey)
	var doc struct {
		Status        string `json:"status"`
		TailProtected string `json:"tail_protected_by"`
		Log           struct {
			Origin    string `json:"origin"`
			Witnessed struct {
				Witnesses []string `json:"witnesses"`
				Size      int64    `json:"size"`
			} `json:"witnessed"`
		} `json:"log"`
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 {
		t.Fatalf("exit %d: %v\n%s%s", code, err, out, errOut)
	}
	if doc.Status != "verified" || doc.TailProtected != "witnesses" || doc.Log.Origin != "example.com/gw1" || len(doc.Log.Witnessed.Witnesses) != 1 {
		t.Fatalf("json: %+v", doc)
	}
	for _, w := range doc.Warnings {
		if strings.Contains(w, "truncation") {
			t.Fatalf("json warns: %s", w)
		}
	}
	// A second witness that never saw the log: quorum 2 fails, exit 13.
	other := litewitness.Start(t, "w2.example/lw")
	code, out, errOut = runCLI(t, "verify-chain", dir, "--witness", lw.Vkey, "--witness", other.Vkey, "--witness-quorum", "2")
	if code != exitcode.ExitLogTrunc || !strings.Contains(out+errOut, "carries 1 of the 2 cosignatures") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	// A note key where a cosignature key belongs.
	code, out, errOut = runCLI(t, "verify-chain", dir, "--witness", "example.com/gw1+01234567+AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	if code != exitcode.ExitUsage || !strings.Contains(errOut, "not an Ed25519 cosignature key") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	// Without --witness the same log still warns (the witnesses are the
	// auditor's to choose, not the log's).
	_, out, _ = runCLI(t, "verify-chain", dir)
	if !strings.Contains(out, "truncation of the tail cannot be detected") {
		t.Fatalf("without --witness:\n%s", out)
	}
}

// TestVerifyChainReceipt: --make-receipt writes a session's receipt from
// the log, and --receipt verifies it alone (the log removed), with the
// witness; an altered record in it exits 10.
func TestVerifyChainReceipt(t *testing.T) {
	dir, lw := witnessedLog(t)
	code, receipt, errOut := runCLI(t, "verify-chain", dir, "--make-receipt", "3")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	f := filepath.Join(t.TempDir(), "s3.receipt")
	if err := os.WriteFile(f, []byte(receipt), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "verify-chain", "--receipt", f, "--witness", lw.Vkey)
	if code != 0 || !strings.Contains(out, "1 record of session 3 (1 session)") || !strings.Contains(out, "WITNESSED: the checkpoint's record is in log example.com/gw1") ||
		!strings.Contains(out, "Result: VERIFIED") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	bad := strings.Replace(receipt, `\"event\":\"start\"`, `\"event\":\"end\"`, 1)
	if bad == receipt {
		t.Fatalf("the receipt holds no session start record:\n%s", receipt)
	}
	os.WriteFile(f, []byte(bad), 0o600)
	code, out, errOut = runCLI(t, "verify-chain", "--receipt", f, "--witness", lw.Vkey)
	if code != exitcode.ExitLogInteg || !strings.Contains(out+errOut, "is not in the tree the checkpoint signs") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
}

// TestVerifyChainFleet: three gateways' logs, each with its own log
// identity, verified at once against one witness: one table, all
// VERIFIED; one of them cut in its tail fails alone, with exit 13, and the
// others stay VERIFIED.
func TestVerifyChainFleet(t *testing.T) {
	lw := litewitness.Start(t, "w1.example/lw")
	var dirs []string
	for i := 1; i <= 3; i++ {
		dirs = append(dirs, witnessedLogAt(t, lw, fmt.Sprintf("example.com/gw%d", i)))
	}
	args := append([]string{"verify-chain", "--witness", lw.Vkey}, dirs...)
	code, out, errOut := runCLI(t, args...)
	if code != 0 || strings.Count(out, "VERIFIED") != 4 || !strings.Contains(out, "example.com/gw3") || !strings.Contains(out, "Result: VERIFIED: all 3 audit logs") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	seg := filepath.Join(dirs[1], "epoch-000002", "seg-000001.jsonl")
	b, _ := os.ReadFile(seg)
	lines := strings.SplitAfter(string(b), "\n")
	os.WriteFile(seg, []byte(strings.Join(lines[:len(lines)-4], "")), 0o600)
	code, out, errOut = runCLI(t, append(args, "-o", "json")...)
	var doc struct {
		Status   string `json:"status"`
		Gateways []struct {
			Dir, Status, Origin string
		} `json:"gateways"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != exitcode.ExitLogTrunc || doc.Status != "failed" || len(doc.Gateways) != 3 ||
		doc.Gateways[0].Status != "verified" || doc.Gateways[1].Status != "failed" || doc.Gateways[2].Status != "verified" {
		t.Fatalf("exit %d: %v\n%s%s", code, err, out, errOut)
	}
}
