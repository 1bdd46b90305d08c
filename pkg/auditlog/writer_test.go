package auditlog

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/scan"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// writeLog writes n call records with conc appenders and closes the writer.
func writeLog(t testing.TB, dir string, opts Options, n, conc int) *Writer {
	t.Helper()
	if opts.Key == nil {
		opts.Key = logtest.Key(t)
	}
	return logtest.WriteLog(t, func() (*Writer, error) { return Open(dir, opts) }, n, conc)
}

func TestWriterRoundTrip(t *testing.T) {
	for _, mode := range []string{record.DurabilityStrict, record.DurabilityGroup, record.DurabilityInterval} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			w := writeLog(t, dir, Options{Durability: mode, CheckpointEvery: 50}, 400, 8)
			res, err := scan.Epoch(dir, 1, scan.Options{Trusted: map[string]bool{w.VerifierKey(): true}})
			if err != nil {
				t.Fatal(err)
			}
			// genesis, initial checkpoint, 400 calls, checkpoints, seal, final checkpoint
			if !res.Sealed || res.Unsealed != 0 || res.Checkpoints < 9 {
				t.Fatalf("sealed=%v unsealed=%d checkpoints=%d", res.Sealed, res.Unsealed, res.Checkpoints)
			}
			if res.Genesis.Durability != mode {
				t.Fatalf("genesis durability %q", res.Genesis.Durability)
			}
			r, err := NewReader(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			calls := 0
			var leaves []tlog.Hash
			for {
				e, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				leaves = append(leaves, e.Hash)
				rec, err := e.Decode()
				if err != nil {
					t.Fatal(err)
				}
				if c, ok := rec.(*record.Call); ok {
					calls++
					if c.Tool != "fs__read" || c.Args.IsZero() {
						t.Fatalf("call decoded as %+v", c)
					}
				}
			}
			if calls != 400 || int64(len(leaves)) != res.Records {
				t.Fatalf("read %d calls, %d records; scan saw %d", calls, len(leaves), res.Records)
			}
			// The frontier agrees with x/mod's own tree hash.
			th, err := tlog.TreeHash(int64(len(leaves)), logtest.MemHashes(logtest.StoredHashes(t, leaves)))
			if err != nil {
				t.Fatal(err)
			}
			if th != res.Root {
				t.Fatalf("root %x, tlog says %x", res.Root, th)
			}
		})
	}
}

func TestCommitmentsAndVault(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t), Recipients: []string{id.Recipient().String()}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte(`{"path":"/etc/passwd"}`)
	c := w.Commit(payload)
	if _, err := w.Append(context.Background(), &record.Call{Session: "s", Agent: "a", Tool: "t", Upstream: "u", EvidenceClass: "plaintext", Args: c, Decision: record.DecisionAllow, PolicyMode: "enforcing", Outcome: record.OutcomeForwarded}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	res, err := scan.Epoch(dir, 1, scan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o, err := NewOpener(res.Genesis, id)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Check(c, payload) || o.Check(c, []byte(`{"path":"/etc/shadow"}`)) {
		t.Fatal("commitment check")
	}
	if err := o.LoadVault(filepath.Join(dir, "epoch-000001"), id); err != nil {
		t.Fatal(err)
	}
	got, err := o.Payload(c)
	if err != nil || string(got) != string(payload) {
		t.Fatalf("vault payload %q, %v", got, err)
	}
	other, _ := age.GenerateX25519Identity()
	if _, err := NewOpener(res.Genesis, other); err == nil {
		t.Fatal("a foreign identity opened the secret")
	}
}

func TestReopenAfterCleanClose(t *testing.T) {
	dir := t.TempDir()
	writeLog(t, dir, Options{}, 10, 1)
	w2 := writeLog(t, dir, Options{}, 10, 1)
	if e, _ := w2.Epoch(); e != 2 {
		t.Fatalf("second epoch is %d", e)
	}
	res, err := scan.Epoch(dir, 2, scan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p := res.Genesis.Predecessor; p == nil || p.Epoch != 1 || !p.Sealed || p.Size == 0 {
		t.Fatalf("predecessor %+v", p)
	}
}

func TestAppendRefusesWriterKinds(t *testing.T) {
	w, err := Open(t.TempDir(), Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Append(context.Background(), &record.Seal{}); err == nil {
		t.Fatal("seal accepted from a caller")
	}
}

func TestSecondWriterRefused(t *testing.T) {
	dir := t.TempDir()
	w, err := Open(dir, Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := Open(dir, Options{Key: logtest.Key(t)}); err == nil {
		t.Fatal("two writers on one directory")
	}
}

var _ = os.Remove

func TestCheckpointsAndClose(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var notes [][]byte
	w, err := Open(dir, Options{Key: logtest.Key(t), CheckpointEvery: 1 << 30, CheckpointInterval: time.Hour, OnCheckpoint: func(n []byte) {
		mu.Lock()
		notes = append(notes, n)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := w.Append(context.Background(), logtest.SampleCall(w, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	cp, err := c2sp.OpenCheckpoint(w.LatestCheckpoint(), verifiers(t, w.VerifierKey()))
	if err != nil {
		t.Fatal(err)
	}
	// genesis, initial checkpoint, 3 calls: the forced checkpoint covers 5.
	if cp.Size != 5 || cp.Origin != w.Origin() {
		t.Fatalf("forced checkpoint %+v", cp)
	}
	if err := w.Checkpoint(); err != nil { // nothing new: no new checkpoint
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	n := len(notes)
	mu.Unlock()
	if n != 3 { // after genesis, forced, final
		t.Fatalf("OnCheckpoint saw %d checkpoints, want 3", n)
	}
	if _, err := w.Append(context.Background(), logtest.SampleCall(w, 9)); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	if err := w.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if err := w.Checkpoint(); !errors.Is(err, ErrClosed) {
		t.Fatalf("checkpoint after close: %v", err)
	}
}

func TestAppendContextCancelled(t *testing.T) {
	w, err := Open(t.TempDir(), Options{Key: logtest.Key(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.Append(ctx, logtest.SampleCall(w, 0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("append with a cancelled context: %v", err)
	}
}

func verifiers(t *testing.T, vkey string) note.Verifiers {
	v, err := note.NewVerifier(vkey)
	if err != nil {
		t.Fatal(err)
	}
	return note.VerifierList(v)
}
