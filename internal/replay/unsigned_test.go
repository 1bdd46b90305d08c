package replay

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// cutSeal drops the seal and the final checkpoint that end epoch 1: the log
// as a gateway that stopped without closing it leaves it, or as anyone
// who can write the directory can cut it (at a record boundary; without a
// saved checkpoint the cut cannot be detected).
func cutSeal(t *testing.T, dir string) string {
	t.Helper()
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	n := len(lines)
	if !strings.Contains(lines[n-2], `"kind":"seal"`) || !strings.Contains(lines[n-1], `"kind":"checkpoint"`) {
		t.Fatalf("epoch 1 does not end with seal and checkpoint:\n%s\n%s", lines[n-2], lines[n-1])
	}
	if err := os.WriteFile(seg, []byte(strings.Join(lines[:n-2], "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return seg
}

// signedTo is the index of each epoch's last checkpoint, as verify-chain
// finds it.
func signedTo(t *testing.T, dir string) map[int]int64 {
	t.Helper()
	vrep, err := auditlog.Verify(dir, auditlog.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[int]int64{}
	for _, e := range vrep.Epochs {
		m[e.Epoch] = e.LastCheckpointAt
	}
	return m
}

// checkUnsigned checks that exactly the calls after their epoch's last
// checkpoint are marked unsigned and counted, that some are and some are
// not, and that the warnings say so.
func checkUnsigned(t *testing.T, rep *Report, last map[int]int64) {
	t.Helper()
	n := 0
	for _, c := range rep.Calls {
		if want := c.Index > last[c.Epoch] || c.resultAt > last[c.Epoch]; c.Unsigned != want {
			t.Fatalf("call %d:%d: unsigned %v, want %v (last checkpoint at %d)", c.Epoch, c.Index, c.Unsigned, want, last[c.Epoch])
		}
		if c.Unsigned {
			n++
		}
	}
	if n == 0 || n == len(rep.Calls) || rep.Summary.Unsigned != n {
		t.Fatalf("%d of %d calls unsigned, summary %d: the fixture must have both", n, len(rep.Calls), rep.Summary.Unsigned)
	}
	for _, s := range rep.Sessions {
		if want := s.last > last[s.Epoch]; s.Unsigned != want {
			t.Fatalf("session %s (last record %d): unsigned %v", s.ID, s.last, s.Unsigned)
		}
	}
	if w := strings.Join(rep.Warnings, "\n"); !strings.Contains(w, fmt.Sprintf("UNSIGNED: %d of the calls are in records no checkpoint signed by their epoch's key covers", n)) {
		t.Fatalf("warnings:\n%s", w)
	}
}

// TestReplayMarksTheUnsealedTailUnsigned: a log cut at a record boundary
// (seal and final checkpoint gone) replayed with exit 0 and no word, its
// calls after the last checkpoint as proven as any. Now the verification's
// warnings are the report's (unsealed tail, not sealed, truncation not
// detectable) and those calls are marked unsigned.
func TestReplayMarksTheUnsealedTailUnsigned(t *testing.T) {
	_, id := newKeys(t)
	dir, _ := writeLogWith(t, id, logSpec{checkpointEvery: 8, extra: func(w *auditlog.Writer, _ []int64) {
		w.Append(context.Background(), &record.Session{ID: "s2", Event: "end", Agent: "bob"})
	}})
	opts := Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}}

	// Sealed: every call is signed, and only what no log shows is warned of.
	rep, err := Run(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Unsigned != 0 || rep.Findings() || len(rep.Warnings) != 2 ||
		!strings.HasPrefix(rep.Warnings[0], VerifyWarning+"trust not established") || !strings.HasPrefix(rep.Warnings[1], VerifyWarning+"truncation of the tail cannot be detected") {
		t.Fatalf("sealed log: summary %+v, warnings %q", rep.Summary, rep.Warnings)
	}

	cutSeal(t, dir)
	rep, err = Run(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Findings() || rep.Unverified != "" {
		t.Fatalf("summary %+v", rep.Summary)
	}
	checkUnsigned(t, rep, signedTo(t, dir))
	if s := rep.Sessions; s[0].Unsigned || !s[1].Unsigned {
		t.Fatalf("sessions: s1 unsigned %v, s2 (ended in the tail) unsigned %v", s[0].Unsigned, s[1].Unsigned)
	}
	w := strings.Join(rep.Warnings, "\n")
	for _, want := range []string{VerifyWarning + "unsealed tail: ", VerifyWarning + "epoch 1 is not sealed", VerifyWarning + "truncation of the tail cannot be detected"} {
		if !strings.Contains(w, want) {
			t.Fatalf("warnings:\n%s\nwant %q", w, want)
		}
	}
}

// TestReplayWarnsOfATornLogLine: a log whose last line was cut off (the
// gateway stopped while writing it) replayed with exit 0 and no word.
func TestReplayWarnsOfATornLogLine(t *testing.T) {
	_, id := newKeys(t)
	dir, _ := writeLogWith(t, id, logSpec{checkpointEvery: 8})
	seg := cutSeal(t, dir)
	torn := `{"body":{"agent":"bob","args":{"bytes":"1`
	f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(torn)
	f.Close()
	rep, err := Run(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(rep.Warnings, "\n"); !strings.Contains(w, fmt.Sprintf(VerifyWarning+"epoch 1 ends with an incomplete line of %d bytes", len(torn))) {
		t.Fatalf("warnings:\n%s", w)
	}
	checkUnsigned(t, rep, signedTo(t, dir))
}

// TestReplayMarksACrashedEpochUnsigned: the tail a crashed gateway left in
// an earlier epoch (auditlog.Report.Unsigned) is unsigned too, although the
// next epoch's genesis fixes it as it was at the restart.
func TestReplayMarksACrashedEpochUnsigned(t *testing.T) {
	_, id := newKeys(t)
	dir, _ := writeLogWith(t, id, logSpec{checkpointEvery: 8})
	cutSeal(t, dir)
	key, _ := newKeys(t)
	w, err := auditlog.Open(dir, auditlog.Options{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	checkUnsigned(t, rep, signedTo(t, dir))
	if w := strings.Join(rep.Warnings, "\n"); !strings.Contains(w, VerifyWarning+"epoch 1 was not sealed") || !strings.Contains(w, "UNSIGNED: its records") || strings.Contains(w, "unsealed tail") {
		t.Fatalf("warnings:\n%s", w)
	}
}

// TestReplayMarksARewrittenUnsignedTail: someone without the gateway's key
// cuts the seal and final checkpoint, rewrites records after the last
// remaining checkpoint and links them again: the log verifies, with
// warnings. Replay used to drop those warnings and report the rewritten
// calls as proven (exit 0). Now they are unsigned, and the rewrite that
// forwards bob's denied call is inconsistent.
func TestReplayMarksARewrittenUnsignedTail(t *testing.T) {
	_, id := newKeys(t)
	dir, idx := writeLogWith(t, id, logSpec{checkpointEvery: 8})
	seg := cutSeal(t, dir)
	last := signedTo(t, dir)
	if idx[4] <= last[1] {
		t.Fatalf("call 4 (%d) is not after the last checkpoint (%d)", idx[4], last[1])
	}
	data, _ := os.ReadFile(seg)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	rewrote := false
	var prev []byte
	for i, l := range lines {
		d := json.NewDecoder(strings.NewReader(l))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			t.Fatal(err)
		}
		body := m["body"].(map[string]any)
		if m["kind"] == "call" && body["agent"] == "bob" && body["tool"] == "git__log" {
			body["outcome"] = "forwarded"
			delete(body, "reason")
			rewrote = true
		}
		if i > 0 {
			m["prev"] = base64.StdEncoding.EncodeToString(prev)
		}
		b, _ := json.Marshal(m)
		b, err := digest.Canonicalize(b)
		if err != nil {
			t.Fatal(err)
		}
		lines[i] = string(b)
		h := sha256.Sum256(append([]byte{0}, b...))
		prev = h[:]
	}
	if !rewrote {
		t.Fatal("bob's call not found")
	}
	os.WriteFile(seg, []byte(strings.Join(lines, "\n")+"\n"), 0o600)

	rep, err := Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	checkUnsigned(t, rep, last)
	if c := rep.Calls[4]; !c.Unsigned || c.Replay.Status != StatusInconsistent || !rep.Findings() {
		t.Fatalf("call 4: unsigned %v, %+v", c.Unsigned, *c.Replay)
	}
}
