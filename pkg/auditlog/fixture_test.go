package auditlog

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/internal/tee"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// fixtureDir is a small sealed two-epoch log with every record kind, its
// keys, its newest checkpoint and the auditor's age identity, for script
// tests and for replay. Regenerate it with:
//
//	CMCP_UPDATE_AUDIT_FIXTURE=1 go test ./pkg/auditlog -run TestAuditFixture
const fixtureDir = "../../testdata/auditlog"

// TestAuditFixture checks that the committed fixture still verifies with
// the trusted keys, and that its payloads open with the auditor identity.
func TestAuditFixture(t *testing.T) {
	if os.Getenv("CMCP_UPDATE_AUDIT_FIXTURE") == "1" {
		writeFixture(t)
	}
	keys, err := os.ReadFile(filepath.Join(fixtureDir, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	cp, err := os.ReadFile(filepath.Join(fixtureDir, "newest.checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(filepath.Join(fixtureDir, "log"), VerifyOptions{Keys: strings.Fields(string(keys)), Checkpoints: [][]byte{cp}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Epochs) != 2 || !rep.Epochs[1].Sealed {
		t.Fatalf("fixture has %d epochs", len(rep.Epochs))
	}
	idb, err := os.ReadFile(filepath.Join(fixtureDir, "auditor.agekey"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := age.ParseIdentities(strings.NewReader(string(idb)))
	if err != nil {
		t.Fatal(err)
	}
	o, err := NewOpener(rep.Epochs[0].Genesis, ids...)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.LoadVault(rep.Epochs[0].Dir, ids...); err != nil {
		t.Fatal(err)
	}
	r, _ := NewReader(filepath.Join(fixtureDir, "log"))
	defer r.Close()
	opened := 0
	for {
		e, err := r.Next()
		if err != nil {
			break
		}
		if e.Pos.Epoch == 1 && e.Kind == record.KindCall {
			rec, _ := e.Decode()
			if c := rec.(*record.Call); !c.Args.IsZero() {
				if _, err := o.Payload(c.Args); err != nil {
					t.Fatal(err)
				}
				opened++
			}
		}
	}
	if opened == 0 {
		t.Fatal("no call payload opened")
	}
}

func writeFixture(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(fixtureDir)
	dir := filepath.Join(fixtureDir, "log")
	ctx := context.Background()
	bundle := digest.Bytes([]byte("policy bundle"))
	var keys []string
	var last []byte
	for epoch := 1; epoch <= 2; epoch++ {
		w, err := Open(dir, Options{Key: logtest.Key(t), Name: "cmcp.test/fixture", CheckpointEvery: 5, CheckpointInterval: time.Hour,
			Gateway: record.GatewayInfo{Version: "v0.0.0-fixture", Platform: "software"}, ConfigDigest: digest.Bytes([]byte("config")),
			PolicyDigest: bundle, CatalogDigest: digest.Bytes([]byte("catalog")), PolicyMode: "enforcing",
			Recipients: []string{id.Recipient().String()}, Vault: epoch == 1,
			Evidence: func(st digest.Digest, pub ed25519.PublicKey) (json.RawMessage, error) {
				// The development provider: genuine software evidence
				// (unattested) binding the key, a nonce and the statement.
				nonce := make([]byte, 32)
				rand.Read(nonce)
				b, err := tee.NewSoftware(time.Now).Attest(ctx, pub, nonce, st)
				if err != nil {
					return nil, err
				}
				return b.Marshal()
			}})
		if err != nil {
			t.Fatal(err)
		}
		recs := []record.Record{
			&record.Policy{Event: "loaded", Bundle: bundle, Mode: "enforcing", Path: "policies/", Policies: 3},
			&record.Spawn{Upstream: "fs", Path: "/usr/local/bin/mcp-fs", Digest: digest.Bytes([]byte("exe")), Pin: digest.Bytes([]byte("exe")), EvidenceClass: "spawn-measured", PID: 4242, Outcome: "started", Session: "sess-1"},
			&record.Upstream{Name: "fs", Transport: "stdio", EvidenceClass: "spawn-measured", Tools: 2, Event: "connected", Session: "sess-1"},
			&record.Session{ID: "sess-1", Event: "start", Agent: "agent-a", Front: "http", ClientName: "claude-code", ClientVersion: "2.1"},
			&record.Drift{Upstream: "fs", Tool: "write", Change: "new", Observed: digest.Bytes([]byte("tool")), Action: "refused", Session: "sess-1"},
		}
		for _, r := range recs {
			if _, err := w.Append(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		args := []byte(`{"path":"/srv/data/report.txt"}`)
		call, err := w.Append(ctx, &record.Call{Session: "sess-1", Agent: "agent-a", RequestID: json.RawMessage(`7`), Tool: "fs__read", Upstream: "fs", UpstreamTool: "read",
			EvidenceClass: "spawn-measured", Args: w.Commit(args), Decision: record.DecisionAllow, PolicyIDs: []string{"policy0"}, PolicyMode: "enforcing", PolicyBundle: bundle, Outcome: record.OutcomeForwarded})
		if err != nil {
			t.Fatal(err)
		}
		result := []byte(`{"content":[{"type":"text","text":"quarterly numbers"}],"isError":false}`)
		if _, err := w.Append(ctx, &record.Result{Call: call.Index, Session: "sess-1", Outcome: record.ResultOK, Result: w.Commit(result), LatencyMicros: 1834}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(ctx, &record.Call{Session: "sess-1", Agent: "agent-a", RequestID: json.RawMessage(`"req-8"`), Tool: "fs__write", Upstream: "fs", UpstreamTool: "write",
			EvidenceClass: "spawn-measured", Args: w.Commit([]byte(`{"path":"/etc/passwd","content":"x"}`)), Decision: record.DecisionDeny, PolicyIDs: []string{"policy2"}, PolicyMode: "enforcing",
			PolicyBundle: bundle, Outcome: record.OutcomeRefused, Reason: "denied by policy"}); err != nil {
			t.Fatal(err)
		}
		for _, r := range []record.Record{
			&record.Stderr{Upstream: "fs", Session: "sess-1", Bytes: 512, Lines: 4},
			&record.Admin{Action: "checkpoint", Actor: "operator"},
			&record.Session{ID: "sess-1", Event: "end", Agent: "agent-a", Reason: "client closed"},
		} {
			if _, err := w.Append(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, w.VerifierKey())
		last = w.LatestCheckpoint()
	}
	os.Remove(filepath.Join(dir, ".lock"))
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(fixtureDir, "keys"), []byte(strings.Join(keys, "\n")+"\n"), 0o644))
	must(os.WriteFile(filepath.Join(fixtureDir, "newest.checkpoint"), last, 0o644))
	must(os.WriteFile(filepath.Join(fixtureDir, "auditor.agekey"), []byte(id.String()+"\n"), 0o644))
	must(os.WriteFile(filepath.Join(fixtureDir, "README.md"), []byte(`# Audit log fixture

A sealed two-epoch audit log written by pkg/auditlog with every record kind
the gateway writes, for script tests (testdata/script/verify_chain*.txtar)
and replay tests. Test material only: the keys are throwaway.

- log/: the audit directory (epoch 1 has a payload vault)
- keys: the note verifier keys of both epochs (cmcp verify-chain --key keys)
- newest.checkpoint: epoch 2's final checkpoint (--checkpoint)
- auditor.agekey: the age identity that opens the commitments and the vault

Regenerate: CMCP_UPDATE_AUDIT_FIXTURE=1 go test ./pkg/auditlog -run TestAuditFixture
`), 0o644))
}
