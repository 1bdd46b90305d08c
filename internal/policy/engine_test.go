package policy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cedar-policy/cedar-go"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

func TestEngineSessionFactsAndModes(t *testing.T) {
	b := load(t, "../../examples/policy/session-limits")
	for _, mode := range []Mode{Enforcing, Advisory, Silent} {
		t.Run(string(mode), func(t *testing.T) {
			e := NewEngine(b, mode, map[string][]string{"contractors": {"erin"}, "ops": {"erin", "carol"}})
			e.now = func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC) }
			read := Call{Agent: "carol", Session: "s1", Tool: "fs__read_file", ToolName: "read_file", Upstream: "fs", EvidenceClass: "spawn-measured", Annotations: DefaultAnnotations}
			post := Call{Agent: "carol", Session: "s1", Tool: "web__post", ToolName: "post", Upstream: "web", EvidenceClass: "tls-pinned", Annotations: DefaultAnnotations}
			o := e.DecideCall(post)
			if !o.Allow || o.Refuse || o.Request.Session.Calls != 0 || len(o.Request.Session.ToolsUsed) != 0 {
				t.Fatalf("first post: %+v", o)
			}
			if o.Request.Time != time.Date(2026, 11, 30, 12, 0, 0, 123000000, time.UTC) || o.Bundle != b.Digest() || o.Mode != mode {
				t.Fatalf("request time %v bundle %v mode %v", o.Request.Time, o.Bundle, o.Mode)
			}
			e.DecideCall(read)
			o = e.DecideCall(post)
			if o.Allow || !slices.Equal(o.PolicyIDs, []string{"no-exfiltration"}) || o.Refuse != (mode == Enforcing) {
				t.Fatalf("post after read: %+v", o)
			}
			if o.Request.Session.Calls != 2 || !slices.Equal(o.Request.Session.ToolsUsed, []string{"fs__read_file", "web__post"}) {
				t.Fatalf("facts %+v", o.Request.Session)
			}
			// The decided request rebuilds the decision.
			if d := b.Decide(&o.Request); d.Allow != o.Allow || !slices.Equal(d.PolicyIDs, o.PolicyIDs) {
				t.Fatalf("rebuild: %+v vs %+v", d, o.Decision)
			}
			// A refused call does not join tools_used; another session is separate.
			o = e.DecideCall(Call{Agent: "carol", Session: "s2", Tool: "web__post", Upstream: "web"})
			if o.Request.Session.Calls != 0 || !o.Allow {
				t.Fatalf("s2: %+v", o)
			}
			if g := e.GroupsOf("erin"); !slices.Equal(g, []string{"contractors", "ops"}) {
				t.Fatalf("groups %v", g)
			}
			e.EndSession("s1")
			if o := e.DecideCall(post); o.Request.Session.Calls != 0 || !o.Allow {
				t.Fatalf("after end: %+v", o)
			}
		})
	}
}

func TestEngineRefusedToolNotUsed(t *testing.T) {
	e := NewEngine(load(t, "../../examples/policy/measured-only"), Enforcing, nil)
	c := Call{Agent: "a", Session: "s", Tool: "x__t", Upstream: "x", EvidenceClass: "spawn-unmeasured"}
	if o := e.DecideCall(c); !o.Refuse {
		t.Fatalf("%+v", o)
	}
	if o := e.DecideCall(c); o.Request.Session.Calls != 1 || len(o.Request.Session.ToolsUsed) != 0 {
		t.Fatalf("%+v", o.Request.Session)
	}
	if e.Visible("a", "s", c) {
		t.Fatal("unmeasured tool visible")
	}
	c.EvidenceClass = "spawn-measured"
	if !e.Visible("a", "s", c) {
		t.Fatal("measured tool hidden")
	}
}

func TestEngineReload(t *testing.T) {
	sch := exampleSchema(t)
	dir := bundle(t, map[string]string{"schema.cedarschema": sch, "a.cedar": `@id("all") permit (principal, action, resource);`})
	b1 := load(t, dir)
	e := NewEngine(b1, Enforcing, nil)
	call := Call{Agent: "a", Session: "s", Tool: "x__t", Upstream: "x"}

	write := func(content string) {
		if err := os.WriteFile(filepath.Join(dir, "a.cedar"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A bundle that does not validate is refused; the old one stays.
	write(`@id("bad") forbid (principal, action, resource) when { resource.nope };`)
	if _, err := e.Reload(context.Background(), dir, digest.Digest{}, Enforcing, nil); err == nil || !strings.Contains(err.Error(), "keeping bundle "+b1.Digest().String()) || !strings.Contains(err.Error(), "a.cedar:1:") {
		t.Fatalf("got %v", err)
	}
	if e.Bundle() != b1 || !e.DecideCall(call).Allow {
		t.Fatal("old bundle not kept")
	}
	// A valid bundle with a stale pin is refused.
	write(`@id("none") forbid (principal, action, resource);`)
	if _, err := e.Reload(context.Background(), dir, b1.Digest(), Enforcing, nil); err == nil || !strings.Contains(err.Error(), "does not match the pin") {
		t.Fatalf("got %v", err)
	}
	// With the new pin it switches, and the mode and groups change with it.
	b2 := load(t, dir)
	sw, err := e.Reload(context.Background(), dir, b2.Digest(), Advisory, map[string][]string{"g": {"a"}})
	if err != nil || sw.Old != b1.Digest() || sw.New != b2.Digest() || sw.Mode != Advisory || sw.Policies != 1 {
		t.Fatalf("switch %+v %v", sw, err)
	}
	o := e.DecideCall(call)
	if o.Allow || o.Refuse || o.Bundle != b2.Digest() || !slices.Equal(o.PolicyIDs, []string{"none"}) || !slices.Equal(o.Request.Groups, []string{"g"}) {
		t.Fatalf("after reload: %+v", o)
	}
}

// TestDependsOnArguments: a call_tool's decision depends on its arguments
// when the bundle checks the argument types its schema declares (at every
// call, whatever the tool), or else when the scope of a policy that reads
// them matches the call.
func TestDependsOnArguments(t *testing.T) {
	b := load(t, "../../examples/policy/path-guard")
	r := Request{Action: ActionCallTool, Agent: "a", Tool: "fs__read", Upstream: "fs", Session: Session{ID: "s"}}
	if !b.DependsOnArguments(&r) {
		t.Fatal("fs call should depend on arguments")
	}
	r.Upstream, r.Tool = "git", "git__log"
	if !b.DependsOnArguments(&r) {
		t.Fatal("git call depends on arguments: path-guard checks path's type at every call")
	}
	r.Arguments = []byte(`{"path":5}`)
	if d := b.Decide(&r); d.Allow || !strings.Contains(d.Reason, `"path" must be a String`) {
		t.Fatalf("git call sending path 5: %+v", d)
	}
	r.Upstream, r.Action = "fs", ActionListTools
	if b.DependsOnArguments(&r) {
		t.Fatal("list_tools never depends on arguments")
	}
	if load(t, "../../examples/policy/allow-list").DependsOnArguments(&Request{Action: ActionCallTool, Agent: "alice", Tool: "git__x", Upstream: "git"}) {
		t.Fatal("allow-list does not read arguments")
	}
	// No declared type: only the scopes of the policies that read them.
	scoped := load(t, scopedArgs(t))
	fs := Request{Action: ActionCallTool, Agent: "a", Tool: "fs__read", Upstream: "fs"}
	git := Request{Action: ActionCallTool, Agent: "a", Tool: "git__log", Upstream: "git"}
	if !scoped.DependsOnArguments(&fs) || scoped.DependsOnArguments(&git) {
		t.Fatal("a bundle that declares no argument depends on the arguments of fs calls only")
	}
}

// scopedArgs is a bundle whose schema declares no argument (it checks no
// type, and context.arguments is always empty) with a policy on fs calls
// that reads context.arguments: DependsOnArguments goes by its scope.
func scopedArgs(t *testing.T) string {
	return bundle(t, map[string]string{"schema.cedarschema": strings.Replace(exampleSchema(t), "  path?: String,", "", 1), "p.cedar": `@id("all") permit (principal, action, resource);
@id("fs-args") forbid (principal, action == Action::"call_tool", resource in Upstream::"fs") unless { context.arguments == {} };`})
}

func TestMemo(t *testing.T) {
	// The session example reads session and now: both are part of the key.
	b := load(t, "../../examples/policy/session-limits")
	if !b.readsContext("session") || !b.readsContext("now") || b.readsContext("arguments") || b.readsAllContext {
		t.Fatalf("reads %v all=%v", b.contextReads, b.readsAllContext)
	}
	m := b.NewMemo()
	r := Request{Action: ActionCallTool, Agent: "a", Groups: []string{"contractors"}, Tool: "web__post", Upstream: "web", Time: noon,
		Session: Session{ID: "s", ToolsUsed: []string{"git__log"}}}
	for range 2 {
		if d := m.Decide(&r); !d.Allow {
			t.Fatalf("%+v", d)
		}
	}
	r2 := r
	r2.Session.ToolsUsed = []string{"fs__read_file"}
	if d := m.Decide(&r2); d.Allow || d.PolicyIDs[0] != "no-exfiltration" {
		t.Fatalf("session facts ignored by the memo: %+v", d)
	}
	r3 := r
	r3.Time = noon.Add(10 * time.Hour)
	if d := m.Decide(&r3); d.Allow || d.PolicyIDs[0] != "contractor-hours" {
		t.Fatalf("time ignored by the memo: %+v", d)
	}
	// The allow-list reads no context: time and session do not split it,
	// but arguments, when given, do (their form alone can deny).
	al := load(t, "../../examples/policy/allow-list")
	if al.readsContext("now") || al.readsContext("session") {
		t.Fatalf("allow-list reads %v", al.contextReads)
	}
	m = al.NewMemo()
	q := Request{Action: ActionCallTool, Agent: "alice", Tool: "git__log", Upstream: "git", Time: noon}
	if !m.Decide(&q).Allow {
		t.Fatal("alice on git")
	}
	q.Arguments = []byte(`{"a":1,"a":2}`)
	if m.Decide(&q).Allow {
		t.Fatal("duplicate member names must deny, memo or not")
	}
	// A policy that uses the context record whole may read everything.
	pl, err := cedar.NewPolicyListFromBytes("w.cedar", []byte(`permit (principal, action, resource) when { context == {} };`))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := pl[0].MarshalJSON()
	wb := &Bundle{contextReads: map[string]bool{}}
	wb.noteContextReads(js, nil)
	if !wb.readsAllContext || !wb.readsContext("now") {
		t.Fatal("whole-context use not detected")
	}
}

// TestMemoDependsOnArguments: the memo gives the bundle's answer, and two
// requests that differ in tool or action are not confused.
func TestMemoDependsOnArguments(t *testing.T) {
	b := load(t, "../../examples/policy/path-guard")
	m := b.NewMemo()
	fs := Request{Action: ActionCallTool, Agent: "a", Tool: "fs__read", Upstream: "fs", Session: Session{ID: "s"}}
	git := fs
	git.Upstream, git.Tool = "git", "git__log"
	list := fs
	list.Action = ActionListTools
	for range 2 {
		for _, r := range []*Request{&fs, &git, &list} {
			if got, want := m.DependsOnArguments(r), b.DependsOnArguments(r); got != want {
				t.Fatalf("%s %s: memo says %v, bundle %v", r.Action, r.Tool, got, want)
			}
		}
	}
	if !m.DependsOnArguments(&fs) || !m.DependsOnArguments(&git) || m.DependsOnArguments(&list) {
		t.Fatal("path-guard checks the arguments' types at every call_tool")
	}
	b = load(t, scopedArgs(t))
	m = b.NewMemo()
	for range 2 {
		for _, r := range []*Request{&fs, &git, &list} {
			if got, want := m.DependsOnArguments(r), b.DependsOnArguments(r); got != want {
				t.Fatalf("%s %s: memo says %v, bundle %v", r.Action, r.Tool, got, want)
			}
		}
	}
	if !m.DependsOnArguments(&fs) || m.DependsOnArguments(&git) || m.DependsOnArguments(&list) {
		t.Fatal("the scoped bundle reads the arguments of fs calls only")
	}
}

// TestLiveMemo: a running engine decides a repeated call from its cache,
// and only a request Cedar could not tell apart from an earlier one shares
// its decision: other arguments, another agent or tool, arguments past the
// key limit and a reloaded bundle are decided afresh. A bundle that reads
// the session facts or the time gets no cache at all.
func TestLiveMemo(t *testing.T) {
	b := load(t, "../../examples/policy/path-guard")
	e := NewEngine(b, Enforcing, nil)
	memo := e.cur.Load().memo
	if memo == nil {
		t.Fatal("path-guard reads neither session nor time: it gets a live memo")
	}
	call := func(agent, tool, args string) Outcome {
		t.Helper()
		c := Call{Agent: agent, Session: "s", Tool: tool, ToolName: "read", Upstream: strings.Split(tool, "__")[0], Annotations: DefaultAnnotations, Arguments: []byte(args)}
		o := e.DecideCall(c)
		r := o.Request
		r.Arguments = c.Arguments
		if d := b.Decide(&r); d.Allow != o.Allow || !slices.Equal(d.PolicyIDs, o.PolicyIDs) || !slices.Equal(d.Errors, o.Errors) || d.Reason != o.Reason {
			t.Fatalf("%s %s %s: cached %+v, bundle %+v", agent, tool, args, o.Decision, d)
		}
		return o
	}
	hits := func(want int64) {
		t.Helper()
		if got := memo.Hits(); got != want {
			t.Fatalf("hits %d, want %d", got, want)
		}
	}
	ok, outside, dotdot := `{"path":"/srv/data/a"}`, `{"path":"/etc/passwd"}`, `{"path":"/srv/data/../etc/passwd"}`
	if !call("a", "fs__read", ok).Allow {
		t.Fatal("path under /srv/data")
	}
	hits(0)
	if !call("a", "fs__read", ok).Allow {
		t.Fatal("the same call again")
	}
	hits(1)
	for _, args := range []string{outside, dotdot, `{"path":"/srv/data/a","path":"/etc/passwd"}`, `{"path": "/etc/passwd"}`} {
		for range 2 {
			if call("a", "fs__read", args).Allow {
				t.Fatalf("%s allowed", args)
			}
		}
	}
	hits(5)
	call("b", "fs__read", ok)
	call("a", "git__read", ok)
	hits(5)
	// Arguments past the key limit are decided by the bundle every time.
	big := `{"path":"/etc/passwd","pad":"` + strings.Repeat("x", liveMemoKey) + `"}`
	for range 2 {
		if call("a", "fs__read", big).Allow {
			t.Fatal("big arguments allowed")
		}
	}
	hits(5)
	// The cache is bounded: it starts again when full.
	for i := range liveMemoEntries + 10 {
		call("a", "fs__read", fmt.Sprintf(`{"path":"/srv/data/%d"}`, i))
	}
	if n := memo.n.Load(); n < 1 || n > liveMemoEntries {
		t.Fatalf("%d entries", n)
	}
	// A reload brings a fresh cache for the new bundle.
	dir := bundle(t, map[string]string{"schema.cedarschema": exampleSchema(t),
		"p.cedar": `@id("nothing-for-a") forbid (principal == Agent::"a", action, resource);` + "\n" + `@id("all") permit (principal, action, resource);`})
	if _, err := e.Reload(context.Background(), dir, digest.Digest{}, Enforcing, nil); err != nil {
		t.Fatal(err)
	}
	b = e.Bundle()
	if o := call("a", "fs__read", ok); o.Allow || !slices.Equal(o.PolicyIDs, []string{"nothing-for-a"}) {
		t.Fatalf("after reload: %+v", o)
	}
	if e.cur.Load().memo == memo || e.cur.Load().memo.Hits() != 0 {
		t.Fatal("the reloaded bundle shares the old cache")
	}
	// Session facts and time change every call: no cache.
	if load(t, "../../examples/policy/session-limits").NewLiveMemo() != nil {
		t.Fatal("session-limits reads session and now: a live memo could never hit")
	}
}

// TestContextLeftOut: Decide leaves out of the context what no policy of
// the bundle reads, and checks arguments it does not convert; every
// decision, error and reason is the one the full context gives.
func TestContextLeftOut(t *testing.T) {
	dirs, _ := filepath.Glob("../../examples/policy/*")
	var bundles []*Bundle
	for _, d := range dirs {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			bundles = append(bundles, load(t, d))
		}
	}
	if len(bundles) < 5 {
		t.Fatalf("%d example bundles", len(bundles))
	}
	al := load(t, "../../examples/policy/allow-list")
	if al.use == nil || al.use.arguments || al.use.session || al.use.now {
		t.Fatalf("allow-list reads nothing from the context: %+v", al.use)
	}
	args := []string{``, `null`, `{}`, `{"path":"/srv/data/x"}`, `{"path":"/etc/passwd","n":1.5}`, `{"a":1,"a":2}`, `[1]`, `{"a":`, `{} x`,
		`{"d":` + strings.Repeat(`[`, MaxArgumentDepth+1) + strings.Repeat(`]`, MaxArgumentDepth+1) + `}`, `{"big":"` + strings.Repeat("x", MaxArgumentBytes) + `"}`,
		`{"s":"\xff"}`, `{"n":1e999,"m":-0.00001,"k":[null,{"x":null}]}`, `{"path":["/etc/passwd"]}`, `{"path":1e3}`}
	for _, b := range bundles {
		full := *b
		full.use = nil
		for _, agent := range []string{"alice", "bob", "carol", "erin"} {
			for _, tool := range []string{"git__log", "fs__read_file", "web__post", "web__search"} {
				for _, a := range args {
					for _, act := range []Action{ActionCallTool, ActionListTools} {
						r := Request{Action: act, Agent: agent, Groups: []string{"ops", "contractors"}[:len(agent)%3], Tool: tool, ToolName: strings.Split(tool, "__")[1],
							Upstream: strings.Split(tool, "__")[0], EvidenceClass: "spawn-measured", Annotations: DefaultAnnotations, Arguments: []byte(a),
							Session: Session{ID: "s", Calls: 3, ToolsUsed: []string{"fs__read_file"}}, Time: noon}
						got, want := b.Decide(&r), full.Decide(&r)
						if !reflect.DeepEqual(got, want) {
							t.Fatalf("%s: %s %s %s %.40q: %+v, full context gives %+v", b.Dir(), act, agent, tool, a, got, want)
						}
					}
				}
			}
		}
	}
}

// TestCredentialGroupsAreGroupParents: groups an agent's credential names
// (an OAuth token's groups claim) are Group parents of its principal, as
// the config's policy.groups are, for calls, listing and reads; and the
// decided request holds them for replay.
func TestCredentialGroupsAreGroupParents(t *testing.T) {
	b := load(t, "../../examples/policy/allow-list")
	e := NewEngine(b, Enforcing, map[string][]string{"ops": {"carol"}})
	call := Call{Agent: "dave@example.com", Session: "s1", Tool: "fs__read_file", ToolName: "read_file", Upstream: "fs", EvidenceClass: "spawn-measured", Annotations: DefaultAnnotations}
	if o := e.DecideCall(call); o.Allow {
		t.Fatalf("dave without groups: allowed (%+v)", o)
	}
	if e.Visible(call.Agent, "s1", call) {
		t.Fatal("dave without groups sees the tool")
	}
	call.Groups = []string{"ops", "eng"}
	o := e.DecideCall(call)
	if !o.Allow || !slices.Equal(o.Request.Groups, []string{"eng", "ops"}) {
		t.Fatalf("dave in ops by his token: %+v", o)
	}
	if d := b.Decide(&o.Request); !d.Allow {
		t.Fatal("the decided request does not rebuild the decision")
	}
	if !e.Visible(call.Agent, "s1", call) {
		t.Fatal("dave in ops by his token does not see the tool")
	}
	// Merged with the configured groups, without duplicates.
	o = e.DecideCall(Call{Agent: "carol", Groups: []string{"ops", "x"}, Session: "s2", Tool: "fs__read_file", Upstream: "fs"})
	if !slices.Equal(o.Request.Groups, []string{"ops", "x"}) {
		t.Fatalf("carol's groups %v", o.Request.Groups)
	}
	if g := e.GroupsOf("carol"); !slices.Equal(g, []string{"ops"}) {
		t.Fatalf("configured groups changed: %v", g)
	}
}
