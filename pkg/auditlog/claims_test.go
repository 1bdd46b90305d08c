package auditlog

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"filippo.io/age"
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
	w, err := Open(dir, Options{Key: testKey(t), Recipients: []string{id.Recipient().String()}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte(`{"path":"/srv/very-secret-payload-7f3a"}`)
	c := w.Commit(secret)
	if _, err := w.Append(context.Background(), &Call{Session: "s", Agent: "a", Tool: "t", Upstream: "u", EvidenceClass: "plaintext", Args: c, Decision: DecisionAllow, PolicyMode: "enforcing", Outcome: OutcomeForwarded}); err != nil {
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
