package auditlog

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestAccessRecord (FORMAT.md section 5): an access record is written,
// verified and decoded strictly like a call record; its URI is in the log
// only as a commitment, which the vault opens.
func TestAccessRecord(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t), Recipients: []string{id.Recipient().String()}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	uri := "file:///srv/very-secret-path-91c2"
	want := &record.Access{Session: "s", Agent: "a", Method: "resources/read", Action: "read_resource", Upstream: "fs", EvidenceClass: "spawn-measured",
		URI: w.Commit([]byte(uri)), Decision: record.DecisionDeny, PolicyMode: "enforcing", Outcome: record.OutcomeRefused, Reason: "denied",
		PolicyInput: &record.AccessInput{Groups: []string{"g"}, EvidenceClass: "spawn-measured", SessionCalls: 3, Time: time.UnixMilli(1700000000123).UTC()}}
	if _, err := w.Append(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(dir, VerifyOptions{}); err != nil {
		t.Fatal(err)
	}
	seg, _ := os.ReadFile(filepath.Join(dir, "epoch-000001", "seg-000001.jsonl"))
	if strings.Contains(string(seg), uri) {
		t.Fatal("the URI is in the log in clear")
	}
	r, err := NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got *record.Access
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.Kind != record.KindAccess {
			continue
		}
		rec, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		got = rec.(*record.Access)
		body := append([]byte(strings.TrimSuffix(string(e.Body), "}")), `,"zz":"1"}`...)
		if _, err := record.DecodeBody(record.KindAccess, body); err == nil {
			t.Fatal("an access body with an unknown member decoded")
		}
	}
	if got == nil || got.Method != want.Method || got.Action != want.Action || got.PolicyInput == nil || got.PolicyInput.SessionCalls != 3 || !got.PolicyInput.Time.Equal(want.PolicyInput.Time) {
		t.Fatalf("decoded %+v", got)
	}
	o, err := NewOpener(mustGenesis(t, dir), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.LoadVault(filepath.Join(dir, "epoch-000001"), id); err != nil {
		t.Fatal(err)
	}
	if p, err := o.Payload(got.URI); err != nil || string(p) != uri {
		t.Fatalf("vault: %q %v", p, err)
	}
}

func mustGenesis(t *testing.T, dir string) *record.Genesis {
	t.Helper()
	r, err := NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	e, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	g, err := e.Decode()
	if err != nil {
		t.Fatal(err)
	}
	return g.(*record.Genesis)
}
