package policy

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// accessBundle writes a bundle with the example schema and these policies.
func accessBundle(t *testing.T, policies string) *Bundle {
	t.Helper()
	sch, err := os.ReadFile("../../examples/policy/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "schema.cedarschema"), sch, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p.cedar"), []byte(policies), 0o644); err != nil {
		t.Fatal(err)
	}
	return load(t, dir)
}

func readReq(agent, up, uri string) *Request {
	return &Request{Action: ActionReadResource, Agent: agent, Upstream: up, EvidenceClass: "spawn-measured", URI: uri,
		Session: Session{ID: "s1"}, Time: noon}
}

func promptReq(agent, up, prompt string) *Request {
	return &Request{Action: ActionGetPrompt, Agent: agent, Upstream: up, EvidenceClass: "spawn-measured", Prompt: prompt,
		Session: Session{ID: "s1"}, Time: noon}
}

// TestExampleBundlesLoad: every example bundle and every test bundle in the
// repository validates against the entity model with the four actions.
func TestExampleBundlesLoad(t *testing.T) {
	dirs, _ := filepath.Glob("../../examples/policy/*")
	dirs = append(dirs, "testdata/attributes", "../replay/testdata/next", "../replay/testdata/recorded")
	n := 0
	for _, d := range dirs {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			continue
		}
		load(t, d)
		n++
	}
	if n < 8 {
		t.Fatalf("loaded %d bundles", n)
	}
}

// TestAccessDefaultDeny: an upstream that no permit names cannot be read,
// nor its prompts got; `resource in Upstream::"x"` covers the upstream's
// resources and prompts as it covers its tools.
func TestAccessDefaultDeny(t *testing.T) {
	b := accessBundle(t, `@id("alice-files") permit (principal == Agent::"alice", action, resource in Upstream::"files");`)
	for _, tc := range []struct {
		name  string
		r     *Request
		allow bool
	}{
		{"read other upstream", readReq("alice", "ev", "test://static"), false},
		{"prompt other upstream", promptReq("alice", "ev", "greet"), false},
		{"read files", readReq("alice", "files", "file:///a"), true},
		{"prompt files", promptReq("alice", "files", "p"), true},
		{"other agent", readReq("bob", "files", "file:///a"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := b.Decide(tc.r)
			if d.Allow != tc.allow || len(d.Errors) > 0 {
				t.Fatalf("got %+v, want allow=%v", d, tc.allow)
			}
			if !d.Allow && d.Reason != "denied: no policy permits it (default deny)" {
				t.Fatalf("reason %q", d.Reason)
			}
		})
	}
}

// TestAccessAttributes: context.uri, context.prompt and the upstream's
// evidence class reach the policies.
func TestAccessAttributes(t *testing.T) {
	b := load(t, "testdata/attributes")
	if d := b.Decide(readReq("alice", "up", "file:///srv/x")); !d.Allow {
		t.Fatalf("read: %+v", d)
	}
	if d := b.Decide(readReq("alice", "up", "file:///etc/passwd")); d.Allow || !slices.Equal(d.PolicyIDs, []string{"uri"}) {
		t.Fatalf("read /etc: %+v", d)
	}
	if d := b.Decide(promptReq("alice", "up", "jailbreak")); d.Allow || !slices.Equal(d.PolicyIDs, []string{"prompt"}) {
		t.Fatalf("prompt: %+v", d)
	}
	if d := b.Decide(readReq("alice", "evil", "file:///srv/x")); d.Allow || !slices.Equal(d.PolicyIDs, []string{"resource-parent"}) {
		t.Fatalf("parent: %+v", d)
	}
	r := promptReq("alice", "up", "greet")
	r.EvidenceClass = "plaintext"
	if d := b.Decide(r); d.Allow || !slices.Equal(d.PolicyIDs, []string{"tool-class"}) {
		t.Fatalf("class: %+v", d)
	}
	// measured-only forbids everything of an unmeasured upstream.
	m := load(t, "../../examples/policy/measured-only")
	for _, r := range []*Request{readReq("alice", "x", "file:///a"), promptReq("alice", "x", "p")} {
		if d := m.Decide(r); !d.Allow {
			t.Fatalf("measured: %+v", d)
		}
		r.EvidenceClass = "spawn-unmeasured"
		if d := m.Decide(r); d.Allow || !slices.Equal(d.PolicyIDs, []string{"no-unmeasured-code"}) {
			t.Fatalf("unmeasured %s: %+v", r.Action, d)
		}
	}
	// path-guard guards the URIs of fs.
	pg := load(t, "../../examples/policy/path-guard")
	for uri, allow := range map[string]bool{"file:///srv/data/a": true, "file:///etc/passwd": false, "file:///srv/data/../etc/passwd": false} {
		if d := pg.Decide(readReq("alice", "fs", uri)); d.Allow != allow {
			t.Errorf("path-guard %s: %+v", uri, d)
		}
	}
	// read-only: the reporter reads resources and prompts.
	ro := load(t, "../../examples/policy/read-only")
	if d := ro.Decide(readReq("reporter", "x", "file:///a")); !d.Allow {
		t.Fatalf("reporter read: %+v", d)
	}
}

// TestAccessMemo: a memo (live or replay) never gives one URI's or one
// prompt's decision for another when the bundle reads them, and shares
// them when it does not.
func TestAccessMemo(t *testing.T) {
	pg := load(t, "../../examples/policy/path-guard")
	if !pg.ReadsURI() || pg.ReadsPrompt() {
		t.Fatalf("path-guard reads uri %v prompt %v", pg.ReadsURI(), pg.ReadsPrompt())
	}
	for _, m := range []*Memo{pg.NewMemo(), pg.NewLiveMemo()} {
		for range 2 {
			if d := m.Decide(readReq("a", "fs", "file:///srv/data/a")); !d.Allow {
				t.Fatalf("allowed uri: %+v", d)
			}
			if d := m.Decide(readReq("a", "fs", "file:///etc/passwd")); d.Allow {
				t.Fatalf("denied uri: %+v", d)
			}
		}
	}
	at := load(t, "testdata/attributes")
	m := at.NewMemo()
	for range 2 {
		if d := m.Decide(promptReq("a", "up", "greet")); !d.Allow {
			t.Fatalf("prompt greet: %+v", d)
		}
		if d := m.Decide(promptReq("a", "up", "jailbreak")); d.Allow {
			t.Fatalf("prompt jailbreak: %+v", d)
		}
	}
	al := load(t, "../../examples/policy/allow-list")
	if al.ReadsURI() {
		t.Fatal("allow-list reads the uri")
	}
	lm := al.NewLiveMemo()
	lm.Decide(readReq("alice", "git", "file:///a"))
	if d := lm.Decide(readReq("alice", "git", "file:///b")); !d.Allow || lm.Hits() != 1 {
		t.Fatalf("allow-list: %+v hits %d", d, lm.Hits())
	}
}

func TestDependsOnURI(t *testing.T) {
	pg := load(t, "../../examples/policy/path-guard")
	if !pg.DependsOnURI(readReq("a", "fs", "x")) || !pg.NewMemo().DependsOnURI(readReq("a", "fs", "x")) {
		t.Fatal("fs reads depend on the uri")
	}
	if pg.DependsOnURI(readReq("a", "git", "x")) || pg.DependsOnURI(promptReq("a", "fs", "p")) {
		t.Fatal("git reads and prompts do not depend on the uri")
	}
	if load(t, "../../examples/policy/allow-list").DependsOnURI(readReq("a", "fs", "x")) {
		t.Fatal("allow-list never reads the uri")
	}
}

// TestAccessEngine: DecideAccess sees the session's facts and does not
// change them; enforcing refuses a deny.
func TestAccessEngine(t *testing.T) {
	b := load(t, "../../examples/policy/allow-list")
	e := NewEngine(b, Enforcing, map[string][]string{"ops": {"carol"}})
	o := e.DecideAccess(Access{Action: ActionReadResource, Agent: "mallory", Session: "s", Upstream: "git", EvidenceClass: "spawn-measured", URI: "file:///x"})
	if o.Allow || !o.Refuse || o.Request.URI != "file:///x" {
		t.Fatalf("mallory: %+v", o)
	}
	o = e.DecideAccess(Access{Action: ActionGetPrompt, Agent: "carol", Session: "s", Upstream: "git", EvidenceClass: "spawn-measured", Prompt: "p"})
	if !o.Allow || o.Refuse || !slices.Equal(o.Request.Groups, []string{"ops"}) || o.AccessInput().EvidenceClass != "spawn-measured" {
		t.Fatalf("carol: %+v", o)
	}
	c := e.DecideCall(Call{Agent: "carol", Session: "s", Tool: "git__x", ToolName: "x", Upstream: "git"})
	if c.Request.Session.Calls != 0 {
		t.Fatalf("an access counted as a call: %+v", c.Request.Session)
	}
	o = e.DecideAccess(Access{Action: ActionReadResource, Agent: "carol", Session: "s", Upstream: "git"})
	if o.Request.Session.Calls != 1 || !slices.Equal(o.Request.Session.ToolsUsed, []string{"git__x"}) {
		t.Fatalf("access facts %+v", o.Request.Session)
	}
	if !e.AccessVisible(Access{Action: ActionReadResource, Agent: "alice", Session: "s", Upstream: "git"}) ||
		e.AccessVisible(Access{Action: ActionReadResource, Agent: "bob", Session: "s", Upstream: "web"}) {
		t.Fatal("AccessVisible")
	}
}
