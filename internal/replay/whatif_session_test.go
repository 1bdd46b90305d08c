package replay

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"filippo.io/age"
)

// TestWhatIfSimulatesTheSession: a what-if bundle that reads
// context.session and changes an earlier call's outcome changes the
// session state later calls are decided on. The bundle refuses git__log
// (alice's call 2, allowed when recorded) and permits git__push only after
// git__log: alice's push (call 3), recorded with tools_used [fs__read_file
// git__log], would have been decided with [fs__read_file] and denied.
// Before, it was evaluated on the recorded state: "unchanged". A filter
// that leaves the session's earlier calls out of the report does not
// leave them out of the simulation.
func TestWhatIfSimulatesTheSession(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	dir := t.TempDir()
	sch, err := os.ReadFile("testdata/recorded/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "schema.cedarschema"), sch, 0o644)
	os.WriteFile(filepath.Join(dir, "p.cedar"), []byte(`
@id("allow-all") permit (principal, action, resource);
@id("no-log") forbid (principal, action == Action::"call_tool", resource == Tool::"git__log");
@id("push-after-log") forbid (principal, action == Action::"call_tool", resource == Tool::"git__push")
  unless { context.session.tools_used.contains("git__log") };
`), 0o644)
	ctx := context.Background()
	rep, err := Run(ctx, f.dir, Options{WhatIf: dir, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(statuses(rep, whatIfOf), " ")
	if want := "unchanged changes changes changes unchanged unchanged"; got != want {
		for _, c := range rep.Calls {
			t.Logf("%s %s %+v", c.Tool, c.Decision, *c.WhatIf)
		}
		t.Fatalf("what-if %s, want %s", got, want)
	}
	if c := rep.Calls[3].WhatIf; c.Decision != "deny" || !strings.Contains(c.Reason, "with tools_used [fs__read_file] under the what-if bundle, recorded [fs__read_file git__log]") {
		t.Fatalf("push: %+v", *c)
	}

	// A filter restricts what is reported, not what is simulated: the
	// session's earlier calls, left out by --tool, still give the push
	// its tools_used. Before, the push was not replayable ("it is not
	// among the calls selected").
	for _, filter := range []Filter{{Tool: "git__push"}, {Agent: "alice", Tool: "git__push"}} {
		rep, err := Run(ctx, f.dir, Options{WhatIf: dir, Identities: []age.Identity{id}, Filter: filter})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Calls) != 1 || rep.Calls[0].Tool != "git__push" {
			t.Fatalf("filtered %+v: %d calls", filter, len(rep.Calls))
		}
		if c := rep.Calls[0].WhatIf; c.Status != StatusChanges || c.Decision != "deny" || !strings.Contains(c.Reason, "with tools_used [fs__read_file] under the what-if bundle, recorded [fs__read_file git__log]") {
			t.Fatalf("filtered %+v: %+v", filter, *c)
		}
		if s := rep.Summary; s.Calls != 1 || s.Changes != 1 || s.WhatIfNotEvaluated != 0 {
			t.Fatalf("filtered %+v: summary %+v", filter, s)
		}
	}
}

// whatIfBundle writes a what-if bundle with the recorded schema and these
// policies.
func whatIfBundle(t *testing.T, policies string) string {
	t.Helper()
	dir := t.TempDir()
	sch, err := os.ReadFile("testdata/recorded/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "schema.cedarschema"), sch, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p.cedar"), []byte(policies), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestWhatIfOnSessionCallsKeepsEachResult: a what-if bundle that reads
// context.session.calls but not tools_used is decided call by call on the
// recorded session_calls, which no what-if outcome changes (the engine
// counts every decided call, refused or not): a filter that leaves the
// session's earlier calls out does not make the calls it selects not
// replayable. Before, any bundle that read context.session made every
// later call of a session not-replayable as soon as an earlier one had no
// known what-if outcome ("it is not among the calls selected").
func TestWhatIfOnSessionCallsKeepsEachResult(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	dir := whatIfBundle(t, `
@id("allow-all") permit (principal, action, resource);
@id("fs-outside-data") forbid (principal, action == Action::"call_tool", resource in Upstream::"fs")
  when { context.arguments has path && !(context.arguments.path like "/srv/data/*") };
@id("budget") forbid (principal, action == Action::"call_tool", resource) when { context.session.calls >= 2 && context.session.id != "" };
`)
	ids := []age.Identity{id}
	for _, tc := range []struct {
		name   string
		filter Filter
		want   string
	}{
		{"all", Filter{}, "unchanged unchanged changes changes changes unchanged"},
		{"push", Filter{Tool: "git__push"}, "changes"},
		{"log", Filter{Tool: "git__log"}, "changes changes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Run(context.Background(), f.dir, Options{WhatIf: dir, Identities: ids, Filter: tc.filter})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(statuses(rep, whatIfOf), " "); got != tc.want {
				for _, c := range rep.Calls {
					t.Logf("%s %s %+v", c.Tool, c.Decision, *c.WhatIf)
				}
				t.Fatalf("what-if %s, want %s", got, tc.want)
			}
			for _, c := range rep.Calls {
				if c.Tool == "git__push" {
					if w := c.WhatIf; w.Decision != "deny" || !slices.Equal(w.PolicyIDs, []string{"budget"}) {
						t.Fatalf("push: %+v", *w)
					}
				}
			}
		})
	}
}
