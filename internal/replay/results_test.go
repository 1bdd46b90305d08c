package replay

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestReplayFindsAResultOfARefusedCall: a result record that answers a call
// the log says was refused (never sent) is a finding, not "refused/ok".
func TestReplayFindsAResultOfARefusedCall(t *testing.T) {
	_, id := newKeys(t)
	dir, idx := writeLogWith(t, id, logSpec{extra: func(w *auditlog.Writer, idx []int64) {
		w.Append(context.Background(), &record.Result{Call: idx[1], Session: "s1", Outcome: record.ResultOK, LatencyMicros: 7,
			Result: w.Commit([]byte(`{"content":[{"type":"text","text":"root:x:0:0"}]}`))})
	}})
	for _, opts := range []Options{{}, {Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}}} {
		rep, err := Run(context.Background(), dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		c := rep.Calls[1]
		if !rep.Findings() || rep.Summary.Inconsistent != 1 || c.Outcome != record.OutcomeRefused || c.Result != record.ResultOK ||
			!strings.Contains(c.Inconsistent, "recorded refused, yet result record") || !strings.Contains(c.Inconsistent, "a refused call is never sent") {
			t.Fatalf("call 1 (%d): %s/%s %q, summary %+v", idx[1], c.Outcome, c.Result, c.Inconsistent, rep.Summary)
		}
		if c.Replay != nil && c.Replay.Status != StatusInconsistent {
			t.Fatalf("call 1 replays as %+v", *c.Replay)
		}
	}
}

// TestReplayWarnsOfStrayResults: a second result for a call and a result
// whose call index holds no call record are named in warnings (epoch and
// record), and the first result stays the call's.
func TestReplayWarnsOfStrayResults(t *testing.T) {
	_, id := newKeys(t)
	var second, orphan, beforeCall int64
	dir, idx := writeLogWith(t, id, logSpec{extra: func(w *auditlog.Writer, idx []int64) {
		ctx := context.Background()
		rc, _ := w.Append(ctx, &record.Result{Call: idx[0], Session: "s1", Outcome: record.ResultIsError, LatencyMicros: 5})
		second = rc.Index
		rc, _ = w.Append(ctx, &record.Result{Call: 99999, Session: "s1", Outcome: record.ResultOK, LatencyMicros: 9})
		orphan = rc.Index
		rc, _ = w.Append(ctx, &record.Result{Call: 1, Session: "s1", Outcome: record.ResultOK, LatencyMicros: 9}) // a session record
		beforeCall = rc.Index
	}})
	rep, err := Run(context.Background(), dir, Options{Filter: Filter{Agent: "bob"}}) // the strays are found whatever is reported
	if err != nil {
		t.Fatal(err)
	}
	if rep.Findings() || len(rep.Calls) != 2 {
		t.Fatalf("summary %+v", rep.Summary)
	}
	want := []string{
		fmt.Sprintf("epoch 1: result record %d (is_error) is a second result for call %d: only the first is shown", second, idx[0]),
		fmt.Sprintf("epoch 1: result record %d (ok) names record 99999, which is no call record before it", orphan),
		fmt.Sprintf("epoch 1: result record %d (ok) names record 1, which is no call record before it", beforeCall),
	}
	got := strings.Join(ownWarnings(rep), "\n")
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Fatalf("warnings:\n%s\nwant %q", got, w)
		}
	}
	rep, err = Run(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.Calls[0]; c.Result != record.ResultOK || c.LatencyMicros != 1200 || len(ownWarnings(rep)) != 3 {
		t.Fatalf("call 0: %s %d, warnings %q", c.Result, c.LatencyMicros, ownWarnings(rep))
	}
}

// TestReplayMarksAMissingResult: a forwarded call without a result record
// shows Result "none", is counted, and a warning names it; a crash can
// cause it, so it is not a finding.
func TestReplayMarksAMissingResult(t *testing.T) {
	_, id := newKeys(t)
	dir, idx := writeLogWith(t, id, logSpec{mut: func(i int, r *record.Call) bool {
		return r.Outcome == record.OutcomeForwarded && i != 0
	}})
	rep, err := Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.Calls[0]; c.Result != ResultNone || rep.Summary.NoResult != 1 || rep.Findings() || c.Replay.Status != StatusSame {
		t.Fatalf("call 0: %s/%q, summary %+v", c.Outcome, c.Result, rep.Summary)
	}
	if c := rep.Calls[1]; c.Result != "" { // refused: no result expected
		t.Fatalf("call 1: %s/%q", c.Outcome, c.Result)
	}
	w := ownWarnings(rep)
	if len(w) != 1 || !strings.Contains(w[0], fmt.Sprintf("forwarded calls without a result record: 1 (epoch:record 1:%d)", idx[0])) {
		t.Fatalf("warnings %q", w)
	}
}

// ownWarnings are the warnings of replay itself, without those of the
// log's verification.
func ownWarnings(rep *Report) []string {
	var w []string
	for _, s := range rep.Warnings {
		if !strings.HasPrefix(s, VerifyWarning) {
			w = append(w, s)
		}
	}
	return w
}
