package auditlog

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestIntervalSyncCoversTheVault: in interval mode an Append writes its
// vault entry and its record without a sync, and the periodic sync makes
// them durable later. That sync must cover the vault too, before the
// segment: a record must never be durable while the vault entry it refers
// to is not (before, the vault was synced only by a flush that had new
// vault bytes of its own, so the periodic sync synced the segment alone).
func TestIntervalSyncCoversTheVault(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var synced []string
	logdir.TestHookSynced = func(f *os.File) {
		mu.Lock()
		synced = append(synced, filepath.Base(f.Name()))
		mu.Unlock()
	}
	defer func() { logdir.TestHookSynced = nil }()
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t), Recipients: []string{id.Recipient().String()}, Vault: true,
		Durability: record.DurabilityInterval, SyncInterval: 20 * time.Millisecond, CheckpointInterval: time.Hour, CheckpointEvery: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mu.Lock()
	synced = nil // what Open synced does not count
	mu.Unlock()
	c := w.Commit([]byte(`{"n":1}`))
	if _, err := w.Append(context.Background(), &record.Call{Session: "s", Agent: "a", Tool: "t", Upstream: "u", EvidenceClass: "plaintext", Args: c, Decision: record.DecisionAllow, PolicyMode: "enforcing", Outcome: record.OutcomeForwarded}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		got := append([]string(nil), synced...)
		mu.Unlock()
		vault, seg := -1, -1
		for i, n := range got {
			if n == VaultFile && vault < 0 {
				vault = i
			}
			if n != VaultFile && seg < 0 {
				seg = i
			}
		}
		if seg >= 0 {
			if vault < 0 || vault > seg {
				t.Fatalf("the segment was synced before the vault entry its record refers to: syncs %v", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sync of the segment within 5s: syncs %v", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
