package replay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// logSpec is how writeLogWith writes the calls() log.
type logSpec struct {
	mode policy.Mode // the engine's and the genesis's mode (enforcing if empty)
	// checkpointEvery is the writer's checkpoint cadence (default 1000).
	checkpointEvery int64
	// mut, if set, rewrites call i's record before it is appended (a
	// gateway whose memory was tampered with, or a log rewritten with the
	// real key: the log verifies) and returns whether a result follows.
	mut func(i int, rec *record.Call) bool
	// before, if set, appends records before call i.
	before func(w *auditlog.Writer, i int)
	// extra, if set, appends records after the calls (idx: their indices).
	extra func(w *auditlog.Writer, idx []int64)
}

// writeLogWith writes the calls() log as writeLog does (real engine, real
// writer, real key), as spec says, and returns it with the call records'
// indices.
func writeLogWith(t *testing.T, id *age.X25519Identity, spec logSpec) (string, []int64) {
	t.Helper()
	b, err := policy.Load(context.Background(), "testdata/recorded", policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mode := spec.mode
	if mode == "" {
		mode = policy.Enforcing
	}
	dir := t.TempDir()
	key, _ := newKeys(t)
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, PolicyDigest: b.Digest(), PolicyMode: string(mode), Durability: record.DurabilityGroup,
		CheckpointEvery: spec.checkpointEvery, Recipients: []string{id.Recipient().String()}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eng := policy.NewEngine(b, mode, nil)
	for _, s := range []string{"s1", "s2"} {
		if _, err := w.Append(ctx, &record.Session{ID: s, Event: "start", Agent: map[string]string{"s1": "alice", "s2": "bob"}[s]}); err != nil {
			t.Fatal(err)
		}
	}
	var idx []int64
	for i, c := range calls() {
		if spec.before != nil {
			spec.before(w, i)
		}
		c.call.Arguments = []byte(c.args)
		o := eng.DecideCall(c.call)
		rec := &record.Call{Session: c.call.Session, Agent: c.call.Agent, Tool: c.call.Tool, Upstream: c.call.Upstream,
			UpstreamTool: c.call.ToolName, EvidenceClass: c.call.EvidenceClass, Args: w.Commit([]byte(c.args)),
			Decision: o.Effect(), PolicyIDs: o.PolicyIDs, PolicyMode: string(o.Mode), PolicyBundle: o.Bundle,
			Outcome: record.OutcomeForwarded, PolicyInput: o.Input()}
		if o.Refuse {
			rec.Outcome, rec.Reason = record.OutcomeRefused, o.Reason
		}
		withResult := rec.Outcome == record.OutcomeForwarded
		if spec.mut != nil {
			withResult = spec.mut(i, rec)
		}
		rc, err := w.Append(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		idx = append(idx, rc.Index)
		if withResult {
			if _, err := w.Append(ctx, &record.Result{Call: rc.Index, Session: rec.Session, Outcome: record.ResultOK, LatencyMicros: 1200, Result: w.Commit([]byte(`{"content":[]}`))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if spec.extra != nil {
		spec.extra(w, idx)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, idx
}

// TestReplayFindsAForwardedDeny: call 4 (bob, git__log) is denied by the
// enforcing bundle. Each variant records it as forwarded, with an ok
// result, in a log that verifies; replay must report it as a finding (exit
// 30), against the bundle and without it. Before, all but the plain flip
// passed: a bundle no genesis or policy record names was "no-bundle" (the
// call record's own digest counted as recorded), dropped policy fields were
// "no-decision", and a forwarded deny, or one relabelled advisory, replays
// as the same deny.
func TestReplayFindsAForwardedDeny(t *testing.T) {
	_, id := newKeys(t)
	other := digest.Bytes([]byte("some other bundle"))
	cases := []struct {
		name   string
		mut    func(*record.Call)
		status string // with --policy
		why    string // in Call.Inconsistent
	}{
		{"plain flip", func(r *record.Call) { r.Decision = "allow" }, StatusDiffers, ""},
		{"flip and a bundle no record put in force", func(r *record.Call) { r.Decision = "allow"; r.PolicyBundle = other },
			StatusInconsistent, "decided by bundle " + other.String() + ", which neither epoch 1's genesis nor its policy records put in force"},
		{"flip and policy fields dropped", func(r *record.Call) {
			r.Decision = "allow"
			r.PolicyBundle, r.PolicyInput, r.PolicyIDs, r.PolicyMode = digest.Digest{}, nil, nil, "none"
		}, StatusInconsistent, "forwarded without a policy decision (mode none), but epoch 1 runs bundle"},
		{"deny recorded, forwarded anyway", func(r *record.Call) { r.Reason = "" },
			StatusInconsistent, "recorded deny in mode enforcing, yet forwarded"},
		{"deny, mode relabelled advisory, forwarded", func(r *record.Call) { r.Reason = ""; r.PolicyMode = "advisory" },
			StatusInconsistent, "recorded mode advisory, but epoch 1 ran bundle"},
		{"deny, mode relabelled silent, refused", func(r *record.Call) { r.PolicyMode = "silent" },
			StatusInconsistent, "recorded mode silent, but epoch 1 ran bundle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := writeLogWith(t, id, logSpec{mut: func(i int, r *record.Call) bool {
				if i != 4 {
					return r.Outcome == record.OutcomeForwarded
				}
				r.Outcome = record.OutcomeForwarded
				tc.mut(r)
				return r.Outcome == record.OutcomeForwarded
			}})
			rep, err := Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
			if err != nil {
				t.Fatal(err)
			}
			c := rep.Calls[4]
			if !rep.Findings() || c.Replay.Status != tc.status || !strings.Contains(c.Inconsistent, tc.why) {
				t.Fatalf("call 4 (%s %s %s): replay %+v, inconsistent %q, findings %v; want %s, %q", c.Decision, c.Mode, c.Outcome, *c.Replay, c.Inconsistent, rep.Findings(), tc.status, tc.why)
			}
			// Where the forged record says git__log was let through (not
			// refused by the policy), bob's next call, decided with
			// tools_used [], contradicts it, and says so.
			collateral := 0
			if c.Mode != "none" && (c.Decision == record.DecisionAllow || c.Mode != string(policy.Enforcing)) {
				collateral = 1
				want := fmt.Sprintf("decided with tools_used [] where the session's calls decided before it (session_calls 0) used [git__log] (git__log from record %d)", c.Index)
				if c5 := rep.Calls[5]; c5.Replay.Status != StatusInconsistent || !strings.Contains(c5.Inconsistent, want) {
					t.Fatalf("call 5: %+v %q, want %q", *c5.Replay, c5.Inconsistent, want)
				}
			}
			if tc.status == StatusInconsistent && (rep.Summary.Inconsistent != 1+collateral || c.Replay.Reason != c.Inconsistent) {
				t.Fatalf("summary %+v, reason %q", rep.Summary, c.Replay.Reason)
			}
			for i, c := range rep.Calls {
				if i != 4 && (i != 5 || collateral == 0) && (c.Inconsistent != "" || c.Replay.Status != StatusSame) {
					t.Fatalf("call %d: %+v %q", i, *c.Replay, c.Inconsistent)
				}
			}
			// The record contradicts itself or its epoch: no bundle is
			// needed to see it.
			if tc.why != "" {
				rep, err := Run(context.Background(), dir, Options{})
				if err != nil || !rep.Findings() || rep.Calls[4].Inconsistent == "" {
					t.Fatalf("timeline: findings %v, %q, %v", rep.Findings(), rep.Calls[4].Inconsistent, err)
				}
			}
		})
	}
}

// TestReplayAcceptsWhatTheGatewayWrites: the records the gateway writes in
// the other modes and around a reload are not inconsistent: a deny
// forwarded in advisory or silent mode, a call refused before the decision
// (mode none), and calls written on either side of a reload's record.
func TestReplayAcceptsWhatTheGatewayWrites(t *testing.T) {
	_, id := newKeys(t)
	for _, mode := range []policy.Mode{policy.Advisory, policy.Silent} {
		dir, _ := writeLogWith(t, id, logSpec{mode: mode})
		rep, err := Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(statuses(rep, replayOf), " "); got != "same same same same same same" || rep.Findings() || rep.Calls[4].Outcome != record.OutcomeForwarded {
			t.Fatalf("%s: %s, %+v", mode, got, rep.Summary)
		}
	}

	// Before call 0, a call refused before any decision (unknown tool).
	// Before call 3, the bundle is reloaded to next (advisory): call 2 was
	// decided by next and written before the reload's record (the reload
	// puts the bundle in force before it records the switch), call 3 by
	// recorded and written after it (it waited for its upstream).
	next, err := policy.Load(context.Background(), "testdata/next", policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nextEng := policy.NewEngine(next, policy.Advisory, nil)
	dir, _ := writeLogWith(t, id, logSpec{
		before: func(w *auditlog.Writer, i int) {
			switch i {
			case 0:
				w.Append(context.Background(), &record.Call{Session: "s1", Agent: "alice", Tool: "nope", Decision: "deny", PolicyMode: "none",
					Args: w.Commit([]byte(`{}`)), Outcome: record.OutcomeRefused, Reason: `unknown tool "nope"`})
			case 3:
				w.Append(context.Background(), &record.Policy{Event: "reloaded", Bundle: next.Digest(), Mode: "advisory", Path: "testdata/next"})
			}
		},
		mut: func(i int, r *record.Call) bool {
			if i == 2 {
				c := calls()[2]
				c.call.Arguments = []byte(c.args)
				o := nextEng.DecideCall(c.call)
				// A reload keeps the sessions' facts (policy.Engine.Reload).
				in := o.Input()
				in.SessionCalls, in.ToolsUsed = r.PolicyInput.SessionCalls, r.PolicyInput.ToolsUsed
				r.Decision, r.PolicyIDs, r.PolicyMode, r.PolicyBundle, r.PolicyInput = o.Effect(), o.PolicyIDs, string(o.Mode), o.Bundle, in
			}
			return r.Outcome == record.OutcomeForwarded
		},
	})
	rep, err := Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded", "testdata/next"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Findings() || rep.Summary.Inconsistent != 0 || rep.Summary.NoDecision != 1 {
		for _, c := range rep.Calls {
			t.Logf("%d %s %s %s %s %+v %q", c.Index, c.Tool, c.Decision, c.Mode, c.Outcome, *c.Replay, c.Inconsistent)
		}
		t.Fatalf("summary %+v", rep.Summary)
	}

	// The same log with call 5, written after the reload, relabelled
	// advisory while decided by recorded, which never ran in that mode.
	dir, _ = writeLogWith(t, id, logSpec{
		before: func(w *auditlog.Writer, i int) {
			if i == 3 {
				w.Append(context.Background(), &record.Policy{Event: "reloaded", Bundle: next.Digest(), Mode: "advisory", Path: "testdata/next"})
			}
		},
		mut: func(i int, r *record.Call) bool {
			if i == 5 {
				r.PolicyMode = "advisory"
			}
			return r.Outcome == record.OutcomeForwarded
		},
	})
	rep, err = Run(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Findings() || rep.Summary.Inconsistent != 1 || !strings.Contains(rep.Calls[5].Inconsistent, "recorded mode advisory, but epoch 1 ran bundle "+rep.Calls[5].Bundle+" in mode enforcing") {
		t.Fatalf("summary %+v, call 5 %q", rep.Summary, rep.Calls[5].Inconsistent)
	}
}

// TestReplayRefusesABundleOnlyACallNames: --policy takes only a bundle that a
// genesis or policy record put in force. A call record that names another
// bundle does not make it "recorded" (before, it did, and replaying a
// forged record against the forger's own bundle passed).
func TestReplayRefusesABundleOnlyACallNames(t *testing.T) {
	_, id := newKeys(t)
	next, err := policy.Load(context.Background(), "testdata/next", policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nextEng := policy.NewEngine(next, policy.Enforcing, nil)
	dir, _ := writeLogWith(t, id, logSpec{mut: func(i int, r *record.Call) bool {
		if i == 4 { // next allows bob's git__log
			c := calls()[4]
			c.call.Arguments = []byte(c.args)
			o := nextEng.DecideCall(c.call)
			r.Decision, r.PolicyIDs, r.PolicyMode, r.PolicyBundle, r.PolicyInput = o.Effect(), o.PolicyIDs, string(o.Mode), o.Bundle, o.Input()
			r.Outcome, r.Reason = record.OutcomeForwarded, ""
		}
		return r.Outcome == record.OutcomeForwarded
	}})
	_, err = Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded", "testdata/next"}, Identities: []age.Identity{id}})
	var ue *exitcode.Error
	if !errors.As(err, &ue) || ue.Code != exitcode.ExitMismatch || !strings.Contains(err.Error(), next.Digest().String()+", which the log never recorded") {
		t.Fatalf("got %v", err)
	}
	rep, err := Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.Calls[4]; c.Replay.Status != StatusInconsistent || !rep.Findings() || !strings.Contains(c.Inconsistent, "decided by bundle "+next.Digest().String()+", which neither") {
		t.Fatalf("call 4: %+v %q", *c.Replay, c.Inconsistent)
	}
}
