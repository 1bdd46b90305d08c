package excerpt

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/internal/logtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestSessionReceipt: a receipt made from the log verifies on its own (no
// log), with the epoch key and a witness's cosignature; it proves the
// session's records (commitments, never payloads) and nothing of other
// sessions; an altered record, a record of another session, an untrusted
// key, a cosignature that does not verify and a missing quorum each fail.
func TestSessionReceipt(t *testing.T) {
	dir := t.TempDir()
	logKey := logtest.Key(t)
	var cps []auditlog.LogCheckpoint
	w, err := auditlog.Open(dir, auditlog.Options{Key: logtest.Key(t), Name: "test.example/audit", CheckpointEvery: 4,
		Log: &auditlog.LogIdentity{Origin: "test.example/gw1", Key: logKey, OnCheckpoint: func(c auditlog.LogCheckpoint) { cps = append(cps, c) }}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		for _, s := range []string{"s1", "s2"} {
			c := logtest.SampleCall(w, i)
			c.Session = s
			if _, err := w.Append(context.Background(), c); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := w.Append(context.Background(), &record.Session{ID: "s1", Event: "end", Agent: "agent-a"}); err != nil {
		t.Fatal(err)
	}
	if err := w.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	vkey := w.VerifierKey()
	_, ed := w.Epoch()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	wit := logtest.NewCosigner(t, "w1.example/w")
	for _, c := range cps {
		if err := auditlog.AppendCosigned(ed, logtest.Cosign(t, c.Note, wit)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := MakeReceipt(dir, "s1", auditlog.VerifyOptions{Keys: []string{vkey}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "/tmp/") {
		t.Fatalf("the receipt holds a payload: %s", b)
	}
	opt := ReceiptOptions{Keys: []string{vkey}, Witnesses: []string{wit.Vkey()}, WitnessQuorum: 1}
	res, err := VerifyReceipt(b, opt)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 11 || res.Kinds[record.KindCall] != 10 || res.Kinds[record.KindSession] != 1 || res.Log == nil || len(res.Log.Witnesses) != 1 || !res.KeysTrusted {
		t.Fatalf("result %+v", res)
	}

	mutate := func(f func(r *SessionReceipt)) []byte {
		var c SessionReceipt
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		f(&c)
		out, _ := c.Encode()
		return out
	}
	other, err := MakeReceipt(dir, "s2", auditlog.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		opt  ReceiptOptions
		c    record.Class
		want string
	}{
		{"altered record", mutate(func(r *SessionReceipt) {
			r.Records[3].Line = strings.Replace(r.Records[3].Line, `"allow"`, `"deny"`, 1)
		}), opt, record.ClassIntegrity, "is not in the tree the checkpoint signs"},
		{"another session's record", mutate(func(r *SessionReceipt) {
			r.Records[0] = other.Records[0]
		}), opt, record.ClassIntegrity, `belongs to session "s2"`},
		{"untrusted key", b, ReceiptOptions{Keys: []string{logtest.MustVkey(t, "test.example/x", logtest.Key(t))}}, record.ClassKey, "is not a trusted key"},
		{"bad cosignature", mutate(func(r *SessionReceipt) {
			i := strings.LastIndex(r.Log.Checkpoint, " ") + 1
			sig := []byte(r.Log.Checkpoint[i:])
			if sig[10] == 'A' {
				sig[10] = 'B'
			} else {
				sig[10] = 'A'
			}
			r.Log.Checkpoint = r.Log.Checkpoint[:i] + string(sig)
		}), opt, record.ClassSignature, "w1.example/w does not verify"},
		{"quorum", b, ReceiptOptions{Keys: []string{vkey}, Witnesses: []string{wit.Vkey(), logtest.NewCosigner(t, "w2.example/w").Vkey()}, WitnessQuorum: 2}, record.ClassTruncation, "carries 1 of the 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := VerifyReceipt(tc.b, tc.opt)
			logtest.WantClass(t, err, tc.c, tc.want)
		})
	}
	if _, err := MakeReceipt(dir, "nobody", auditlog.VerifyOptions{}); err == nil || !strings.Contains(err.Error(), "no record of session") {
		t.Fatalf("unknown session: %v", err)
	}
}

// TestReceiptPrefersTheCosignedCheckpoint: a checkpoint signed after the
// one a receipt was forced for (another session's receipt, the interval
// timer) is not cosigned yet; the receipt rests on the newest checkpoint
// a witness cosigned that covers the session, not on the newest one
// (which made a receipt on request fail --witness under load).
func TestReceiptPrefersTheCosignedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	var cps []auditlog.LogCheckpoint
	w, err := auditlog.Open(dir, auditlog.Options{Key: logtest.Key(t), Name: "test.example/audit", CheckpointEvery: 1000,
		Log: &auditlog.LogIdentity{Origin: "test.example/gw1", Key: logtest.Key(t), OnCheckpoint: func(c auditlog.LogCheckpoint) { cps = append(cps, c) }}})
	if err != nil {
		t.Fatal(err)
	}
	add := func(s string, n int) {
		for i := range n {
			c := logtest.SampleCall(w, i)
			c.Session = s
			if _, err := w.Append(context.Background(), c); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Checkpoint(); err != nil {
			t.Fatal(err)
		}
	}
	add("s1", 3) // the checkpoint the receipt of s1 was forced for
	add("s2", 2) // a later one, not cosigned
	vkey := w.VerifierKey()
	_, ed := w.Epoch()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	wit := logtest.NewCosigner(t, "w1.example/w")
	// cps: the genesis checkpoint's, s1's, s2's, the seal's.
	if len(cps) != 4 {
		t.Fatalf("%d log checkpoints", len(cps))
	}
	if err := auditlog.AppendCosigned(ed, logtest.Cosign(t, cps[1].Note, wit)); err != nil {
		t.Fatal(err)
	}
	opt := ReceiptOptions{Keys: []string{vkey}, Witnesses: []string{wit.Vkey()}, WitnessQuorum: 1}
	r, err := MakeReceipt(dir, "s1", auditlog.VerifyOptions{Keys: []string{vkey}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := r.Encode()
	if res, err := VerifyReceipt(b, opt); err != nil || res.Records != 3 {
		t.Fatalf("s1's receipt with the witness: %v %+v", err, res)
	}
	// s2's records are after the cosigned checkpoint: its receipt rests on
	// the epoch key and says so when a witness is required.
	r, err = MakeReceipt(dir, "s2", auditlog.VerifyOptions{Keys: []string{vkey}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = r.Encode()
	if _, err := VerifyReceipt(b, ReceiptOptions{Keys: []string{vkey}}); err != nil {
		t.Fatalf("s2's receipt on the epoch key: %v", err)
	}
	if _, err := VerifyReceipt(b, opt); err == nil || !strings.Contains(err.Error(), "no cosigned log checkpoint") {
		t.Fatalf("s2's receipt with the witness: %v", err)
	}
}
