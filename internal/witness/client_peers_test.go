//go:build peers

// These tests run a real witness, litewitness v0.6.1, installed by
//
//	eval "$(bash scripts/peers.sh)"
//	go test -tags peers ./internal/witness

package witness

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/witness/litewitness"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

const origin = "test.example/gw1"

// epochRun is one start of a writer with a witness client, as a gateway
// runs them.
type epochRun struct {
	w *auditlog.Writer
	c *Client
}

func openEpoch(t *testing.T, dir string, logKey ed25519.PrivateKey, ws ...*litewitness.Server) *epochRun {
	t.Helper()
	_, vkey, err := c2sp.NewNoteKeys(origin, logKey)
	if err != nil {
		t.Fatal(err)
	}
	var cfg Config
	for _, s := range ws {
		cfg.Witnesses = append(cfg.Witnesses, Witness{URL: s.URL, Key: s.Vkey})
	}
	cfg.LogKey, cfg.AuditDir = vkey, dir
	cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 500*time.Millisecond
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, epochKey, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(dir, auditlog.Options{Key: epochKey, Name: "test.example/audit", CheckpointEvery: 5,
		Log: &auditlog.LogIdentity{Origin: origin, Key: logKey, OnCheckpoint: c.Submit}})
	if err != nil {
		t.Fatal(err)
	}
	base, fr := w.LogBase()
	_, edir := w.Epoch()
	if err := c.Attach(edir, base, fr); err != nil {
		t.Fatal(err)
	}
	return &epochRun{w: w, c: c}
}

func (r *epochRun) append(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		rec := &record.Session{ID: fmt.Sprintf("s%d", i), Event: "start", Agent: "a"}
		if _, err := r.w.Append(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
}

// close seals the epoch and waits for the witnesses to cosign its final
// checkpoint.
func (r *epochRun) close(t *testing.T) {
	t.Helper()
	if err := r.w.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.c.Close(ctx); err != nil {
		t.Fatalf("%v; status %+v", err, r.c.Status())
	}
}

func waitState(t *testing.T, c *Client, name, state string) Status {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, s := range c.Status() {
			if s.Name == name && s.State == state {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("witness %s never reached state %s: %+v", name, state, c.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	return to
}

func verify(dir string, quorum int, ws ...*litewitness.Server) (*auditlog.Report, error) {
	var keys []string
	for _, s := range ws {
		keys = append(keys, s.Vkey)
	}
	return auditlog.Verify(dir, auditlog.VerifyOptions{Witnesses: keys, WitnessQuorum: quorum})
}

func wantFailure(t *testing.T, err error, class record.Class, sub string) {
	t.Helper()
	var ve *record.VerifyError
	if !errors.As(err, &ve) || ve.Class != class || !strings.Contains(ve.Error(), sub) {
		t.Fatalf("got %v, want a %s failure saying %q", err, class, sub)
	}
}

// TestLitewitnessFollowsTheLogAcrossRestarts: a real witness cosigns the
// log checkpoints of three epochs (three restarts) with no operator step
// between them; the log verifies with the witness and no saved checkpoint,
// the truncation warning gone. Then a log cut after the witness saw it, a
// rollback to an earlier copy (the witness refuses to cosign it: state
// conflict, and the rolled-back log fails --witness), and that fork shown
// to a second witness (which cosigns it, but a quorum of both is not met)
// are each caught.
func TestLitewitnessFollowsTheLogAcrossRestarts(t *testing.T) {
	w1 := litewitness.Start(t, "w1.example/lw")
	_, logKey, _ := ed25519.GenerateKey(rand.Reader)
	_, vkey, _ := c2sp.NewNoteKeys(origin, logKey)
	w1.AddLog(origin, vkey)

	dir := filepath.Join(t.TempDir(), "audit")
	r := openEpoch(t, dir, logKey, w1)
	r.append(t, 12)
	r.close(t)
	afterEpoch1 := copyDir(t, dir)
	for range 2 {
		r = openEpoch(t, dir, logKey, w1)
		r.append(t, 9)
		r.close(t)
	}
	rep, err := verify(dir, 1, w1)
	if err != nil {
		t.Fatal(err)
	}
	if wc := rep.Log.Witnessed; wc == nil || wc.Size != rep.Records || len(wc.Witnesses) != 1 {
		t.Fatalf("witnessed %+v, want all %d records cosigned by w1", wc, rep.Records)
	}
	for _, w := range rep.Warnings {
		if strings.Contains(w, "truncation") {
			t.Fatalf("a witnessed log still warns about truncation: %s", w)
		}
	}

	// Truncated: the last epoch cut in its tail.
	cut := copyDir(t, dir)
	seg := filepath.Join(cut, "epoch-000003", "seg-000001.jsonl")
	b, _ := os.ReadFile(seg)
	lines := strings.SplitAfter(string(b), "\n")
	os.WriteFile(seg, []byte(strings.Join(lines[:len(lines)-5], "")), 0o600)
	_, err = verify(cut, 1, w1)
	wantFailure(t, err, record.ClassTruncation, "records were cut from its tail")

	// Rolled back: the copy taken after epoch 1 runs on; the witness has
	// seen epochs 2 and 3 and refuses it.
	r = openEpoch(t, afterEpoch1, logKey, w1)
	r.append(t, 30)
	if err := r.w.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	st := waitState(t, r.c, "w1.example/lw", StateConflict)
	if !strings.Contains(st.Error, "fork or rollback") && !strings.Contains(st.Error, "rolled back") {
		t.Fatalf("conflict says %q", st.Error)
	}
	r.w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	r.c.Close(ctx)
	cancel()
	_, err = verify(afterEpoch1, 1, w1)
	wantFailure(t, err, record.ClassTruncation, "carries 0 of the 1 cosignatures")

	// The fork shown to a second witness: it cosigns, but a quorum of
	// both witnesses is not met, and the real log lacks w2 as well.
	w2 := litewitness.Start(t, "w2.example/lw")
	w2.AddLog(origin, vkey)
	r = openEpoch(t, afterEpoch1, logKey, w2)
	r.append(t, 3)
	r.close(t)
	if _, err := verify(afterEpoch1, 1, w2); err != nil {
		t.Fatalf("the fork verifies with w2 alone (as it should: w2 never saw the real log): %v", err)
	}
	_, err = verify(afterEpoch1, 2, w1, w2)
	wantFailure(t, err, record.ClassTruncation, "carries 1 of the 2 cosignatures required from the given witnesses (cosigned by: w2.example/lw)")
}

// TestLitewitnessDownIsRetried: a witness that is down shows as down and
// the writer goes on; once it is back, the newest checkpoint is cosigned.
func TestLitewitnessDownIsRetried(t *testing.T) {
	w1 := litewitness.Start(t, "w1.example/lw")
	_, logKey, _ := ed25519.GenerateKey(rand.Reader)
	_, vkey, _ := c2sp.NewNoteKeys(origin, logKey)
	w1.AddLog(origin, vkey)
	dir := filepath.Join(t.TempDir(), "audit")
	r := openEpoch(t, dir, logKey, w1)
	waitState(t, r.c, "w1.example/lw", StateOK)
	w1.Stop()
	start := time.Now()
	r.append(t, 40) // never waits for the witness
	if err := r.w.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	t.Logf("40 appends and a checkpoint with the witness down: %v", time.Since(start))
	st := waitState(t, r.c, "w1.example/lw", StateDown)
	if !strings.Contains(st.Error, "unreachable") {
		t.Fatalf("down says %q", st.Error)
	}
	w1.Restart()
	waitState(t, r.c, "w1.example/lw", StateOK)
	r.close(t)
	if _, err := verify(dir, 1, w1); err != nil {
		t.Fatal(err)
	}
}

// TestLitewitnessUnknownLogIsRefused: a witness that was not told about
// the log answers 403 (v0.6.1; 404 in later versions): state refused, with
// the witnessctl commands that fix it.
func TestLitewitnessUnknownLogIsRefused(t *testing.T) {
	w1 := litewitness.Start(t, "w1.example/lw")
	_, logKey, _ := ed25519.GenerateKey(rand.Reader)
	r := openEpoch(t, filepath.Join(t.TempDir(), "audit"), logKey, w1)
	st := waitState(t, r.c, "w1.example/lw", StateRefused)
	if !strings.Contains(st.Error, "witnessctl add-log -origin "+origin) {
		t.Fatalf("refused says %q", st.Error)
	}
	r.w.Close()
	r.c.Close(context.Background())
}
