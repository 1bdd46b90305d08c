package auditlog

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestPayloadsOnlyAsCommitmentsAndVaultDeletable: a payload never appears in
// the log itself, only its commitment (and, sealed with age, in the vault);
// deleting the vault (retention, crypto-shredding) leaves a log that still
// verifies (FORMAT.md sections 6 and 7).
func TestPayloadsOnlyAsCommitmentsAndVaultDeletable(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t), Recipients: []string{id.Recipient().String()}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte(`{"path":"/srv/very-secret-payload-7f3a"}`)
	c := w.Commit(secret)
	if _, err := w.Append(context.Background(), &record.Call{Session: "s", Agent: "a", Tool: "t", Upstream: "u", EvidenceClass: "plaintext", Args: c, Decision: record.DecisionAllow, PolicyMode: "enforcing", Outcome: record.OutcomeForwarded}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	epoch := filepath.Join(dir, "epoch-000001")
	ents, err := os.ReadDir(epoch)
	if err != nil {
		t.Fatal(err)
	}
	vaultSeen := false
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(epoch, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("very-secret-payload")) {
			t.Fatalf("%s holds the payload in clear", e.Name())
		}
		vaultSeen = vaultSeen || e.Name() == VaultFile
	}
	if !vaultSeen {
		t.Fatalf("no %s written with Vault set", VaultFile)
	}
	if _, err := Verify(dir, VerifyOptions{}); err != nil {
		t.Fatalf("log with its vault: %v", err)
	}
	if err := os.Remove(filepath.Join(epoch, VaultFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(dir, VerifyOptions{}); err != nil {
		t.Fatalf("deleting the vault broke verification: %v", err)
	}
}

// TestUnknownMembersRefused (FORMAT.md section 2): a line with a member other
// than body, kind, prev, seq, ts and v is refused, and so is a body of any
// kind with a member its record type does not have, even when the line is
// otherwise canonical.
func TestUnknownMembersRefused(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "auditlog", "log", "epoch-000001", "seg-000001.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	seen := map[record.Kind]bool{}
	for i, line := range lines {
		e, err := record.ParseLine(line)
		if err != nil {
			t.Fatalf("fixture line %d: %v", i+1, err)
		}
		// "x" sorts after "v": still canonical, one member too many.
		extra := append(bytes.TrimSuffix(append([]byte(nil), line...), []byte("}")), []byte(`,"x":"1"}`)...)
		if _, err := record.ParseLine(extra); err == nil || !strings.Contains(err.Error(), "unknown member") {
			t.Errorf("line %d with an extra member: err = %v", i+1, err)
		}
		if seen[e.Kind] {
			continue
		}
		seen[e.Kind] = true
		if _, err := record.DecodeBody(e.Kind, e.Body); err != nil {
			t.Fatalf("line %d: %s body does not decode: %v", i+1, e.Kind, err)
		}
		body := append(bytes.TrimSuffix(append([]byte(nil), e.Body...), []byte("}")), []byte(`,"zz_unknown":"1"}`)...)
		if _, err := record.DecodeBody(e.Kind, body); err == nil {
			t.Errorf("%s body with an unknown member was accepted", e.Kind)
		}
	}
	if len(seen) < 10 {
		t.Fatalf("only %d record kinds in the fixture", len(seen))
	}
}

// TestVaultWrittenBeforeTheRecord (FORMAT.md section 7): when Append of a
// call that refers to a commitment returns, the vault entry for that
// commitment is already in vault.jsonl on disk, readable by another opener.
// (That it was also fsynced first cannot be observed without cutting power.)
func TestVaultWrittenBeforeTheRecord(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t), Recipients: []string{id.Recipient().String()}, Vault: true, Durability: record.DurabilityStrict})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range 5 {
		payload := []byte(fmt.Sprintf(`{"n":%d}`, i))
		c := w.Commit(payload)
		if _, err := w.Append(context.Background(), &record.Call{Session: "s", Agent: "a", Tool: "t", Upstream: "u", EvidenceClass: "plaintext", Args: c, Decision: record.DecisionAllow, PolicyMode: "enforcing", Outcome: record.OutcomeForwarded}); err != nil {
			t.Fatal(err)
		}
		// The writer is still open: read what is on disk now.
		res, err := scan.Epoch(dir, 1, scan.Options{})
		if err != nil {
			t.Fatal(err)
		}
		o, err := NewOpener(res.Genesis, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.LoadVault(filepath.Join(dir, "epoch-000001"), id); err != nil {
			t.Fatal(err)
		}
		got, err := o.Payload(c)
		if err != nil || string(got) != string(payload) {
			t.Fatalf("call %d: vault entry not on disk when Append returned: %q, %v", i, got, err)
		}
	}
}
