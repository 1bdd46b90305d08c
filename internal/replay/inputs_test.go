package replay

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// inputsBundle forbids git__push once the session read a file, and git__log
// from 2020 on: decisions that depend on tools_used and on the time.
func inputsBundle(t *testing.T) (string, *policy.Bundle) {
	t.Helper()
	dir := t.TempDir()
	sch, err := os.ReadFile("testdata/recorded/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "schema.cedarschema"), sch, 0o644)
	os.WriteFile(filepath.Join(dir, "p.cedar"), []byte(`
@id("allow-all") permit (principal, action, resource);
@id("no-exfil") forbid (principal, action == Action::"call_tool", resource == Tool::"git__push")
  when { context.session.tools_used.contains("fs__read_file") };
@id("log-frozen") forbid (principal, action == Action::"call_tool", resource == Tool::"git__log")
  when { context.now >= datetime("2020-01-01T00:00:00Z") };
@id("no-rm") forbid (principal, action == Action::"call_tool", resource == Tool::"fs__rm");
`), 0o644)
	b, err := policy.Load(context.Background(), dir, policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return dir, b
}

// writeInputsLog writes session s1 as the gateway does (real engine, real
// writer): fs__rm refused (enforcing deny: its tool is not used), fs__read_file
// forwarded, an access, git__push and git__log (both denied and refused);
// forge, if set, rewrites a record before it is appended.
func writeInputsLog(t *testing.T, b *policy.Bundle, id *age.X25519Identity, forge func(i int, o *policy.Outcome, in *record.PolicyInput)) string {
	t.Helper()
	return writeInputsLogSkipping(t, b, id, forge, -1)
}

// writeInputsLogSkipping is writeInputsLog that decides record skip (if
// not -1) but does not write it: a call missing from the log.
func writeInputsLogSkipping(t *testing.T, b *policy.Bundle, id *age.X25519Identity, forge func(i int, o *policy.Outcome, in *record.PolicyInput), skip int) string {
	t.Helper()
	ctx := context.Background()
	key, _ := newKeys(t)
	dir := t.TempDir()
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, PolicyDigest: b.Digest(), PolicyMode: "enforcing", Durability: record.DurabilityGroup,
		Recipients: []string{id.Recipient().String()}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "alice"})
	eng := policy.NewEngine(b, policy.Enforcing, nil)
	call := func(tool string) policy.Call {
		up, name, _ := strings.Cut(tool, "__")
		return policy.Call{Agent: "alice", Session: "s1", Tool: tool, ToolName: name, Upstream: up, EvidenceClass: "spawn-measured", Arguments: []byte(`{}`)}
	}
	for i, tool := range []string{"fs__rm", "fs__read_file", "access", "git__push", "git__log"} {
		if tool == "access" {
			o := eng.DecideAccess(policy.Access{Action: policy.ActionGetPrompt, Agent: "alice", Session: "s1", Upstream: "git", EvidenceClass: "spawn-measured", Prompt: "p"})
			ai := o.AccessInput()
			in := &record.PolicyInput{ToolsUsed: ai.ToolsUsed, Time: ai.Time, SessionCalls: ai.SessionCalls}
			if forge != nil {
				forge(i, &o, in)
			}
			ai.ToolsUsed, ai.Time, ai.SessionCalls = in.ToolsUsed, in.Time, in.SessionCalls
			if _, err := w.Append(ctx, &record.Access{Session: "s1", Agent: "alice", Method: "prompts/get", Action: "get_prompt", Upstream: "git",
				EvidenceClass: "spawn-measured", Prompt: "p", Decision: o.Effect(), PolicyIDs: o.PolicyIDs, PolicyMode: "enforcing",
				PolicyBundle: b.Digest(), Outcome: record.OutcomeForwarded, PolicyInput: ai}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		c := call(tool)
		o := eng.DecideCall(c)
		in := o.Input()
		if forge != nil {
			forge(i, &o, in)
		}
		rec := &record.Call{Session: "s1", Agent: "alice", Tool: c.Tool, Upstream: c.Upstream, UpstreamTool: c.ToolName,
			EvidenceClass: c.EvidenceClass, Args: w.Commit(c.Arguments), Decision: o.Effect(), PolicyIDs: o.PolicyIDs,
			PolicyMode: "enforcing", PolicyBundle: b.Digest(), Outcome: record.OutcomeForwarded, PolicyInput: in}
		if !o.Allow {
			rec.Outcome, rec.Reason = record.OutcomeRefused, o.Reason
		}
		if i == skip {
			continue
		}
		rc, err := w.Append(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Outcome == record.OutcomeForwarded {
			w.Append(ctx, &record.Result{Call: rc.Index, Session: "s1", Outcome: record.ResultOK, LatencyMicros: 900, Result: w.Commit([]byte(`{"content":[]}`))})
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReplayFindsForgedDecisionInputs: a log written with the gateway's
// key records git__push and git__log, both denied, as allowed by allow-all
// and forwarded, altering only the decision input the record carries:
// git__push's tools_used emptied though the session's earlier record shows
// fs__read_file forwarded, git__log's time set to 2019 though the record is
// written now. Each is inconsistent (exit 30), with --policy and without.
// The honest log, with a refused call (whose tool is not used) and an
// access between the calls, has no finding. Before, both forgeries
// replayed "same".
func TestReplayFindsForgedDecisionInputs(t *testing.T) {
	bdir, b := inputsBundle(t)
	_, id := newKeys(t)
	ctx := context.Background()
	honest, err := Run(ctx, writeInputsLog(t, b, id, nil), Options{Policies: []string{bdir}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if honest.Findings() || len(ownWarnings(honest)) > 0 || honest.Summary.Same != 5 {
		t.Fatalf("the honest log: summary %+v, warnings %q", honest.Summary, honest.Warnings)
	}
	cases := []struct {
		name  string
		forge func(i int, o *policy.Outcome, in *record.PolicyInput)
		at    int // the forged record among the calls and accesses
		why   string
	}{
		{"tools_used emptied", func(i int, o *policy.Outcome, in *record.PolicyInput) {
			if i == 3 {
				o.Allow, o.PolicyIDs, in.ToolsUsed = true, []string{"allow-all"}, nil
			}
		}, 3, "tools_used [] where the session's calls decided before it (session_calls 0-1) used [fs__read_file]"},
		{"tools_used of an access emptied", func(i int, o *policy.Outcome, in *record.PolicyInput) {
			if i == 2 {
				in.ToolsUsed = nil
			}
		}, 2, "tools_used [] where the session's calls decided before it (session_calls 0-1) used [fs__read_file]"},
		{"a refused call's tool added", func(i int, o *policy.Outcome, in *record.PolicyInput) {
			if i == 3 {
				in.ToolsUsed = []string{"fs__read_file", "fs__rm"}
			}
		}, 3, "tools_used [fs__read_file fs__rm] where"},
		{"time set back", func(i int, o *policy.Outcome, in *record.PolicyInput) {
			if i == 4 {
				o.Allow, o.PolicyIDs = true, []string{"allow-all"}
				in.Time = time.Date(2019, 6, 1, 12, 0, 0, 0, time.UTC)
			}
		}, 4, "decided at 2019-06-01T12:00:00Z, but its record was written at"},
		// A forwarded call's record is written within its result's latency
		// (900µs) of the decision, so 10 minutes before is too long ago
		// though well within the 24 hours of a call without a result.
		{"time of a forwarded call set back 10 minutes", func(i int, o *policy.Outcome, in *record.PolicyInput) {
			if i == 1 {
				in.Time = in.Time.Add(-10 * time.Minute)
			}
		}, 1, "within the call's latency (900µs, its result record"},
		{"time set forward", func(i int, o *policy.Outcome, in *record.PolicyInput) {
			if i == 1 {
				in.Time = in.Time.Add(time.Hour)
			}
		}, 1, "after its record was written at"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeInputsLog(t, b, id, tc.forge)
			for name, opts := range map[string]Options{"--policy": {Policies: []string{bdir}, Identities: []age.Identity{id}}, "no --policy": {}} {
				rep, err := Run(ctx, dir, opts)
				if err != nil {
					t.Fatal(err)
				}
				c := rep.Calls[tc.at]
				if !rep.Findings() || !strings.Contains(c.Inconsistent, tc.why) {
					t.Errorf("%s: findings %v; %s inconsistent %q, want %q", name, rep.Findings(), c.Tool+c.Method, c.Inconsistent, tc.why)
				}
				if c.Replay != nil && c.Replay.Status != StatusInconsistent {
					t.Errorf("%s: replay %+v", name, *c.Replay)
				}
			}
		})
	}
}

// TestReplayFindsAToolMissingWithACallMissing: session s1's git__push
// (session_calls 2) is missing from the log, so git__log's tools_used may
// hold a tool the log does not show; but every tool the log shows must be
// in it: git__log's tools_used emptied lacks fs__read_file, forwarded by
// call 1. The honest log with the same call missing has no such finding.
func TestReplayFindsAToolMissingWithACallMissing(t *testing.T) {
	bdir, b := inputsBundle(t)
	_, id := newKeys(t)
	ctx := context.Background()
	for _, forged := range []bool{false, true} {
		dir := writeInputsLogSkipping(t, b, id, func(i int, o *policy.Outcome, in *record.PolicyInput) {
			if i == 4 && forged {
				in.ToolsUsed = nil
			}
		}, 3)
		for name, opts := range map[string]Options{"--policy": {Policies: []string{bdir}, Identities: []age.Identity{id}}, "no --policy": {}} {
			rep, err := Run(ctx, dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			c := rep.Calls[len(rep.Calls)-1]
			if c.Tool != "git__log" {
				t.Fatalf("last call %s", c.Tool)
			}
			if !forged {
				if c.Inconsistent != "" {
					t.Errorf("honest, %s: inconsistent %q", name, c.Inconsistent)
				}
				continue
			}
			if !rep.Findings() || !strings.Contains(c.Inconsistent, "without [fs__read_file]") || !strings.Contains(c.Inconsistent, "fs__read_file from record ") {
				t.Errorf("%s: findings %v, inconsistent %q", name, rep.Findings(), c.Inconsistent)
			}
		}
	}
}
