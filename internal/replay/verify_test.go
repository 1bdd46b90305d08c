package replay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestReplayRefusesTruncationFoundAtTheEnd cuts the seal and the final
// checkpoint off a log and replays it against that checkpoint, saved
// outside the log: every remaining record passes its own checks while replay
// reads it, and only the end of verification finds the truncation. Replay
// must still refuse the log (and, with Unverified, mark every line).
func TestReplayRefusesTruncationFoundAtTheEnd(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	r, err := auditlog.NewReader(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	var saved []byte
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.Kind == record.KindCheckpoint {
			rec, err := e.Decode()
			if err != nil {
				t.Fatal(err)
			}
			saved = []byte(rec.(*record.CheckpointRecord).Note)
		}
	}
	r.Close()
	seg := filepath.Join(f.dir, "epoch-000001", "seg-000001.jsonl")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	lines = lines[:len(lines)-3] // seal, final checkpoint, and the empty string after the last '\n'
	if err := os.WriteFile(seg, bytes.Join(lines, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := Options{Policies: []string{"testdata/recorded"}, Verify: auditlog.VerifyOptions{Checkpoints: [][]byte{saved}}}
	rep, err := Run(context.Background(), f.dir, opts)
	var nv *NotVerifiedError
	if !errors.As(err, &nv) || nv.ExitCode() != exitcode.ExitLogTrunc || rep != nil {
		t.Fatalf("got %v, %v", rep, err)
	}
	opts.Unverified = true
	rep, err = Run(context.Background(), f.dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Unverified == "" || len(rep.Calls) != len(calls()) {
		t.Fatalf("unverified %q, %d calls", rep.Unverified, len(rep.Calls))
	}
	for _, c := range rep.Calls {
		if !c.Unverified {
			t.Fatalf("call %d not marked", c.Index)
		}
	}
}

// TestReplayUnverifiedReadsPastTheDamage: verification stops at the first
// damaged record, but --unverified replays the whole log, the records after
// the damage too.
func TestReplayUnverifiedReadsPastTheDamage(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	seg := filepath.Join(f.dir, "epoch-000001", "seg-000001.jsonl")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(data, []byte(`"agent":"alice","args"`)) // alice's first call
	if i < 0 {
		t.Fatal("alice's call not found")
	}
	copy(data[i:], `"agent":"alicf"`)
	if err := os.WriteFile(seg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), f.dir, Options{Policies: []string{"testdata/recorded"}, Unverified: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Unverified == "" || len(rep.Calls) != len(calls()) || rep.Calls[0].Agent != "alicf" {
		t.Fatalf("unverified %q, %d calls", rep.Unverified, len(rep.Calls))
	}
	for _, c := range rep.Calls {
		if !c.Unverified {
			t.Fatalf("call %d not marked", c.Index)
		}
	}
}
