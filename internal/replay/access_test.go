package replay

import (
	"context"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestAccessRecordsReplayed: access records are replayed like calls:
// re-decided against the recorded bundle (a flipped one differs), counted
// apart from the calls, held to the same consistency rules (a deny
// forwarded in enforcing mode), and never expected to have a result.
func TestAccessRecordsReplayed(t *testing.T) {
	_, id := newKeys(t)
	b, err := policy.Load(context.Background(), "testdata/recorded", policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eng := policy.NewEngine(b, policy.Enforcing, nil)
	type acc struct {
		a   policy.Access
		mut func(*record.Access)
	}
	accs := []acc{
		{policy.Access{Action: policy.ActionReadResource, Agent: "alice", Session: "s1", Upstream: "fs", EvidenceClass: "spawn-measured", URI: "file:///srv/data/a"}, nil},
		{policy.Access{Action: policy.ActionGetPrompt, Agent: "alice", Session: "s1", Upstream: "git", EvidenceClass: "spawn-measured", Prompt: "review"}, nil},
		// bob may not read git: denied, refused.
		{policy.Access{Action: policy.ActionReadResource, Agent: "bob", Session: "s2", Upstream: "git", EvidenceClass: "spawn-measured", URI: "git://x"}, nil},
		// The same, flipped to allow.
		{policy.Access{Action: policy.ActionGetPrompt, Agent: "bob", Session: "s2", Upstream: "git", EvidenceClass: "spawn-measured", Prompt: "p"},
			func(r *record.Access) {
				r.Decision, r.Outcome, r.Reason = record.DecisionAllow, record.OutcomeForwarded, ""
			}},
		// The same, denied but forwarded.
		{policy.Access{Action: policy.ActionReadResource, Agent: "bob", Session: "s2", Upstream: "git", EvidenceClass: "spawn-measured", URI: "git://y"},
			func(r *record.Access) { r.Outcome, r.Reason = record.OutcomeForwarded, "" }},
	}
	dir, _ := writeLogWith(t, id, logSpec{extra: func(w *auditlog.Writer, _ []int64) {
		for _, x := range accs {
			o := eng.DecideAccess(x.a)
			method := map[policy.Action]string{policy.ActionReadResource: "resources/read", policy.ActionGetPrompt: "prompts/get"}[x.a.Action]
			r := &record.Access{Session: x.a.Session, Agent: x.a.Agent, Method: method, Action: string(x.a.Action), Upstream: x.a.Upstream,
				EvidenceClass: x.a.EvidenceClass, Prompt: x.a.Prompt, Decision: o.Effect(), PolicyIDs: o.PolicyIDs, PolicyMode: string(o.Mode),
				PolicyBundle: o.Bundle, Outcome: record.OutcomeForwarded, PolicyInput: o.AccessInput()}
			if x.a.Action == policy.ActionReadResource {
				r.URI = w.Commit([]byte(x.a.URI))
			}
			if o.Refuse {
				r.Outcome, r.Reason = record.OutcomeRefused, o.Reason
			}
			if x.mut != nil {
				x.mut(r)
			}
			if _, err := w.Append(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
	}})
	rep, err := Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	n := len(calls())
	if rep.Summary.Calls != n || rep.Summary.Accesses != len(accs) || rep.Summary.NoResult != 0 {
		t.Fatalf("summary %+v", rep.Summary)
	}
	got := rep.Calls[n:]
	want := []string{StatusSame, StatusSame, StatusSame, StatusDiffers, StatusInconsistent}
	for i, c := range got {
		if c.Action == "" || c.Method == "" || c.Replay == nil || c.Replay.Status != want[i] {
			t.Errorf("access %d: %+v %+v", i, c, c.Replay)
		}
	}
	if !strings.Contains(got[4].Inconsistent, "recorded deny in mode enforcing, yet forwarded") || !rep.Findings() {
		t.Fatalf("forwarded deny: %q", got[4].Inconsistent)
	}
	if got[1].Prompt != "review" || got[0].Prompt != "" {
		t.Fatalf("prompts %q %q", got[0].Prompt, got[1].Prompt)
	}
}
