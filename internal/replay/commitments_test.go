package replay

import (
	"context"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestReplayFindsADroppedOrReusedArgumentCommitment: call 1 (alice reads
// /etc/passwd) is denied by fs-outside-data. A log written with the real
// key records it as an allow by fs-allowed, forwarded, and either drops
// its argument commitment or reuses call 0's (a payload the policy
// allows), or a result reuses a call's commitment. The gateway commits to
// every decided call's arguments ({} when none were sent) and numbers each
// commitment anew, so each is an inconsistent record, with the vault and
// without it, with --policy and without it. Before, the dropped commitment
// replayed with no arguments, and the reused one with call 0's: "same".
func TestReplayFindsADroppedOrReusedArgumentCommitment(t *testing.T) {
	_, id := newKeys(t)
	cases := []struct {
		name    string
		mut     func(first record.Commitment, rec *record.Call)
		why     string
		refused bool // the call stays denied and refused: only its commitment is touched
	}{
		{"dropped", func(_ record.Commitment, rec *record.Call) { rec.Args = record.Commitment{} },
			"call record without the commitment to its arguments", false},
		{"reused", func(first record.Commitment, rec *record.Call) { rec.Args = first },
			"commitment 0, which an earlier record of the epoch already used", false},
		// A decided call that was refused keeps its commitment too: only
		// a call refused before the pipeline saw it has none, and no
		// decision (no policy_input).
		{"dropped from a refused deny", func(_ record.Commitment, rec *record.Call) { rec.Args = record.Commitment{} },
			"a refused call record without the commitment to its arguments", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var first record.Commitment
			dir, idx := writeLogWith(t, id, logSpec{mut: func(i int, rec *record.Call) bool {
				if i == 0 {
					first = rec.Args
				}
				if i != 1 {
					return rec.Outcome == record.OutcomeForwarded
				}
				if tc.refused {
					if rec.Outcome != record.OutcomeRefused || rec.PolicyInput == nil {
						t.Fatalf("call 1 is not a decided, refused call: %+v", rec)
					}
					tc.mut(first, rec)
					return false
				}
				rec.Decision, rec.PolicyIDs, rec.Outcome, rec.Reason = "allow", []string{"fs-allowed"}, record.OutcomeForwarded, ""
				tc.mut(first, rec)
				return true
			}})
			for name, opts := range map[string]Options{
				"with the vault":    {Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}},
				"without the vault": {Policies: []string{"testdata/recorded"}},
				"without --policy":  {},
			} {
				rep, err := Run(context.Background(), dir, opts)
				if err != nil {
					t.Fatal(err)
				}
				if !rep.Findings() {
					t.Errorf("%s: no finding", name)
				}
				for _, c := range rep.Calls {
					if c.Index != idx[1] {
						continue
					}
					if !strings.Contains(c.Inconsistent, tc.why) {
						t.Errorf("%s: inconsistent %q, want it to say %q", name, c.Inconsistent, tc.why)
					}
					if c.Replay != nil && c.Replay.Status == StatusSame {
						t.Errorf("%s: replay says same: %+v", name, *c.Replay)
					}
				}
			}
		})
	}
}

// TestReplayFindsAResultReusingACommitment: a result record whose
// commitment repeats its call's arguments' (the gateway numbers each
// payload anew) makes the call inconsistent.
func TestReplayFindsAResultReusingACommitment(t *testing.T) {
	_, id := newKeys(t)
	var args record.Commitment
	dir, idx := writeLogWith(t, id, logSpec{
		mut: func(i int, rec *record.Call) bool {
			if i == 0 {
				args = rec.Args
				return false // its result is written by extra
			}
			return rec.Outcome == record.OutcomeForwarded
		},
		extra: func(w *auditlog.Writer, idx []int64) {
			if _, err := w.Append(context.Background(), &record.Result{Call: idx[0], Session: "s1", Outcome: record.ResultOK, Result: args}); err != nil {
				t.Fatal(err)
			}
		},
	})
	rep, err := Run(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Findings() || !strings.Contains(rep.Calls[0].Inconsistent, "already used") || rep.Calls[0].Index != idx[0] {
		t.Fatalf("findings %v, call 0 inconsistent %q", rep.Findings(), rep.Calls[0].Inconsistent)
	}
}

// TestReplayFindsAnAccessReusingACommitment: an access record whose URI
// commitment repeats call 0's arguments' (the gateway numbers each payload
// anew) is inconsistent.
func TestReplayFindsAnAccessReusingACommitment(t *testing.T) {
	_, id := newKeys(t)
	var args record.Commitment
	dir, _ := writeLogWith(t, id, logSpec{
		mut: func(i int, rec *record.Call) bool {
			if i == 0 {
				args = rec.Args
			}
			return rec.Outcome == record.OutcomeForwarded
		},
		extra: func(w *auditlog.Writer, idx []int64) {
			if _, err := w.Append(context.Background(), &record.Access{Session: "s1", Agent: "alice", Method: "resources/read", Action: "read_resource",
				Upstream: "fs", EvidenceClass: "spawn-measured", URI: args, Outcome: record.OutcomeForwarded}); err != nil {
				t.Fatal(err)
			}
		},
	})
	rep, err := Run(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	last := rep.Calls[len(rep.Calls)-1]
	if !rep.Findings() || last.Method != "resources/read" || !strings.Contains(last.Inconsistent, "its URI's commitment 0, which an earlier record of the epoch already used") {
		t.Fatalf("findings %v, last %s inconsistent %q", rep.Findings(), last.Method, last.Inconsistent)
	}
}

// TestReplayFindsAFarCommitmentReused: commitment numbers past the dense
// bitset (2^25 and up) are checked for reuse too: two call records with
// commitment 2^25+5 make the second inconsistent.
func TestReplayFindsAFarCommitmentReused(t *testing.T) {
	_, id := newKeys(t)
	const far = 1<<25 + 5
	dir, idx := writeLogWith(t, id, logSpec{mut: func(i int, rec *record.Call) bool {
		if i <= 1 {
			rec.Args.ID = far
		}
		return rec.Outcome == record.OutcomeForwarded
	}})
	rep, err := Run(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Findings() {
		t.Fatal("no finding")
	}
	for _, c := range rep.Calls {
		if c.Index == idx[1] && !strings.Contains(c.Inconsistent, "commitment 33554437, which an earlier record of the epoch already used") {
			t.Errorf("call 1 inconsistent %q", c.Inconsistent)
		}
		if c.Index == idx[0] && c.Inconsistent != "" {
			t.Errorf("call 0 inconsistent %q", c.Inconsistent)
		}
	}
}
