// Package logtest is the test kit of pkg/auditlog and the packages rooted
// at it: signing keys, sample call records, a log filled by concurrent
// appenders, hash stores, witness cosigners, record relinking and error
// checks. It does not import auditlog, so auditlog's own tests use it too:
// WriteLog takes the writer as a type parameter.
package logtest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logdir"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Key returns a new Ed25519 signing key.
func Key(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Committer commits payloads: an *auditlog.Writer.
type Committer interface {
	Commit(payload []byte) record.Commitment
}

// SampleCall returns call record i of session sess-1, its arguments
// committed by w.
func SampleCall(w Committer, i int) *record.Call {
	return &record.Call{
		Session: "sess-1", Agent: "agent-a", Tool: "fs__read", Upstream: "fs", UpstreamTool: "read",
		EvidenceClass: "spawn-measured", Args: w.Commit([]byte(fmt.Sprintf(`{"path":"/tmp/%d"}`, i))),
		Decision: record.DecisionAllow, PolicyIDs: []string{"policy0"}, PolicyMode: "enforcing",
		PolicyBundle: digest.Bytes([]byte("bundle")), Outcome: record.OutcomeForwarded,
	}
}

// Writer is what WriteLog needs of an *auditlog.Writer (R: its receipt).
type Writer[R any] interface {
	Committer
	Append(ctx context.Context, rec record.Record) (R, error)
	Close() error
}

// WriteLog opens a writer with open, appends n sample calls with conc
// appenders and closes the writer.
func WriteLog[W Writer[R], R any](t testing.TB, open func() (W, error), n, conc int) W {
	t.Helper()
	w, err := open()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	per := n / conc
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if _, err := w.Append(context.Background(), SampleCall(w, g*per+i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return w
}

// MemHashes is a tlog.HashReader over stored hashes in memory.
type MemHashes []tlog.Hash

// ReadHashes implements tlog.HashReader.
func (m MemHashes) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		out[i] = m[x]
	}
	return out, nil
}

// StoredHashes returns the stored hashes of the tree over leaves.
func StoredHashes(t testing.TB, leaves []tlog.Hash) []tlog.Hash {
	var st MemHashes
	for i, l := range leaves {
		hs, err := tlog.StoredHashesForRecordHash(int64(i), l, st)
		if err != nil {
			t.Fatal(err)
		}
		st = append(st, hs...)
	}
	return st
}

// Cosigner is a cosignature/v1 signer (c2sp.org/tlog-cosignature), as a
// witness signs; the tests against a real witness use litewitness.
type Cosigner struct {
	name string
	key  ed25519.PrivateKey
	now  int64
}

func (c *Cosigner) pubRaw() []byte {
	return append([]byte{0x04}, c.key.Public().(ed25519.PublicKey)...)
}

// Name implements note.Signer.
func (c *Cosigner) Name() string { return c.name }

// KeyHash implements note.Signer.
func (c *Cosigner) KeyHash() uint32 { return c2sp.NoteKeyHash(c.name, c.pubRaw()) }

// Sign implements note.Signer: a cosignature/v1 at the cosigner's time.
func (c *Cosigner) Sign(msg []byte) ([]byte, error) {
	m := fmt.Appendf(nil, "cosignature/v1\ntime %d\n", c.now)
	sig := ed25519.Sign(c.key, append(m, msg...))
	return append(binary.BigEndian.AppendUint64(nil, uint64(c.now)), sig...), nil
}

// Vkey returns the cosigner's verifier key.
func (c *Cosigner) Vkey() string {
	return fmt.Sprintf("%s+%08x+%s", c.name, c.KeyHash(), base64.StdEncoding.EncodeToString(c.pubRaw()))
}

// NewCosigner returns a cosigner named name with a new key, signing at
// the present time.
func NewCosigner(t *testing.T, name string) *Cosigner {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &Cosigner{name: name, key: k, now: time.Now().Unix()}
}

// Cosign adds c's cosignature to a signed log checkpoint.
func Cosign(t *testing.T, signed []byte, c *Cosigner) []byte {
	t.Helper()
	text, _, _ := strings.Cut(string(signed), "\n\n")
	n, err := note.Sign(&note.Note{Text: text + "\n"}, c)
	if err != nil {
		t.Fatal(err)
	}
	_, line, _ := strings.Cut(string(n), "\n\n")
	return append(append([]byte(nil), signed...), line...)
}

// MustVkey returns the note verifier key of name and k.
func MustVkey(t *testing.T, name string, k ed25519.PrivateKey) string {
	_, v, err := c2sp.NewNoteKeys(name, k)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// WantClass fails t unless err is a *record.VerifyError of class c whose
// message holds sub.
func WantClass(t *testing.T, err error, c record.Class, sub string) {
	t.Helper()
	var ve *record.VerifyError
	if !errors.As(err, &ve) || ve.Class != c || !strings.Contains(ve.Error(), sub) {
		t.Fatalf("got %v, want a %s failure saying %q", err, c, sub)
	}
}

// Within fails t if f does not return within d (a hang on hostile input).
func Within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s hung for %v", what, d)
		return nil
	}
}

// Relink returns line with seq and prev set so that it follows prevLine at
// index seq: what anyone with write access can do without the key.
func Relink(t *testing.T, line, prevLine []byte, seq int64) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatal(err)
	}
	h := tlog.RecordHash(prevLine)
	m["prev"], _ = json.Marshal(base64.StdEncoding.EncodeToString(h[:]))
	m["seq"], _ = json.Marshal(strconv.FormatInt(seq, 10))
	raw, _ := json.Marshal(m)
	out, err := digest.Canonicalize(raw)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// AppendAfterSeal appends to the first segment of the closed log in dir
// (epoch 1, sealed) a copy of its call record at line 5, relinked without
// the key after its last record, at index n (the records it held). It
// returns the segment's path, its bytes and lines from before, and n.
func AppendAfterSeal(t *testing.T, dir string) (seg string, orig []byte, lines [][]byte, n int64) {
	t.Helper()
	seg = filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	orig, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines = bytes.Split(bytes.TrimSuffix(orig, []byte("\n")), []byte("\n"))
	n = int64(len(lines))
	call := lines[5]
	if !bytes.Contains(call, []byte(`"kind":"call"`)) {
		t.Fatalf("line 5 is not a call: %s", call)
	}
	extra := Relink(t, call, lines[n-1], n)
	if err := os.WriteFile(seg, append(append(bytes.Clone(orig), extra...), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return seg, orig, lines, n
}

// AbortedStart is a log of Epochs complete epochs and then epoch Empty
// without one complete record: what a start that stopped before its
// genesis record was durable leaves (Make empties the epoch directory).
type AbortedStart struct {
	Name   string
	Epochs int               // complete epochs written
	Empty  int               // the epoch emptied
	Make   func(edir string) // how it is emptied
	Fail   bool              // Verify fails (it is not the newest epoch, or the only one)
}

// AbortedStarts returns the aborted starts Verify and Prove are tested
// with.
func AbortedStarts() []AbortedStart {
	return []AbortedStart{
		{"newest with an empty segment", 2, 3, func(edir string) { os.WriteFile(filepath.Join(edir, logdir.SegmentName(1)), nil, 0o600) }, false},
		{"newest without segments", 2, 3, func(edir string) {}, false},
		{"newest with a torn genesis", 1, 2, func(edir string) {
			os.WriteFile(filepath.Join(edir, logdir.SegmentName(1)), []byte(`{"body":{"checkpoint_every":"10`), 0o600)
		}, false},
		{"before the newest", 3, 2, func(edir string) { os.Truncate(filepath.Join(edir, logdir.SegmentName(1)), 0) }, true},
		{"the only epoch", 0, 1, func(edir string) { os.WriteFile(filepath.Join(edir, logdir.SegmentName(1)), nil, 0o600) }, true},
	}
}

// BenchLog returns a directory holding a sealed log of n call records and
// its verifier key, building it with write (which returns the key) once
// per machine under the temp dir.
func BenchLog(b *testing.B, n int, write func(dir string) (vkey string)) (string, string) {
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("cmcp-auditlog-bench-%d", n))
	if kb, err := os.ReadFile(dir + ".vkey"); err == nil {
		return dir, string(kb)
	}
	os.RemoveAll(dir)
	vkey := write(dir)
	if err := os.WriteFile(dir+".vkey", []byte(vkey), 0o644); err != nil {
		b.Fatal(err)
	}
	return dir, vkey
}
