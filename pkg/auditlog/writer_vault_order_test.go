package auditlog

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// callsOnDisk returns the call records in dir's log as they are on disk.
func callsOnDisk(t *testing.T, dir string) (*record.Genesis, []*record.Call) {
	t.Helper()
	r, err := NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var g *record.Genesis
	var calls []*record.Call
	for {
		e, err := r.Next()
		if err == io.EOF {
			return g, calls
		}
		if err != nil {
			t.Fatal(err)
		}
		rec, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		switch rec := rec.(type) {
		case *record.Genesis:
			g = rec
		case *record.Call:
			calls = append(calls, rec)
		}
	}
}

// TestNoRecordRefersToAVaultEntryNotWritten: the vault is written before
// the log, so a writer stopped between the two writes (here the vault's
// write fails: its descriptor is /dev/full) leaves no call record whose
// arguments are missing from the vault. TestVaultWrittenBeforeTheRecord
// only looks after Append returned, so writing the log first passed it
// (found in review).
func TestNoRecordRefersToAVaultEntryNotWritten(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t), Recipients: []string{id.Recipient().String()}, Vault: true, Durability: record.DurabilityStrict})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(context.Background(), logtest.SampleCall(w, 0)); err != nil {
		t.Fatal(err)
	}
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	if err := syscall.Dup2(int(full.Fd()), int(w.vaultF.Fd())); err != nil {
		t.Fatal(err)
	}
	_, err = w.Append(context.Background(), logtest.SampleCall(w, 1))
	var fe *FatalError
	if !errors.As(err, &fe) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append with the vault on a full disk: %v, want a FatalError (ENOSPC)", err)
	}
	w.Close()

	g, calls := callsOnDisk(t, dir)
	o, err := NewOpener(g, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.LoadVault(filepath.Join(dir, "epoch-000001"), id); err != nil {
		t.Fatal(err)
	}
	if len(calls) == 0 {
		t.Fatal("no call record on disk")
	}
	for i, c := range calls {
		if _, err := o.Payload(c.Args); err != nil {
			t.Errorf("call record %d (commitment %d) is on disk, its vault entry is not: %v", i, c.Args.ID, err)
		}
	}
}
