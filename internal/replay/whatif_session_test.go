package replay

import (
	"context"
	"os"
	"path/filepath"
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
// Before, it was evaluated on the recorded state: "unchanged". With a
// filter that leaves the session's earlier calls out, their what-if
// outcome is not known, and the push is not replayable, naming the call.
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

	rep, err = Run(ctx, f.dir, Options{WhatIf: dir, Identities: []age.Identity{id}, Filter: Filter{Tool: "git__push"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Calls) != 1 || rep.Calls[0].WhatIf.Status != StatusNotReplayable || !strings.Contains(rep.Calls[0].WhatIf.Reason, "it is not among the calls selected") {
		t.Fatalf("filtered: %d calls, %+v", len(rep.Calls), *rep.Calls[0].WhatIf)
	}
}
