package policy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

func load(t testing.TB, dir string) *Bundle {
	t.Helper()
	b, err := Load(context.Background(), dir, LoadOptions{})
	if err != nil {
		t.Fatalf("load %s: %v", dir, err)
	}
	return b
}

var noon = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// base is a call that the attributes bundle allows.
func base() Request {
	return Request{
		Action: ActionCallTool, Agent: "alice", Groups: []string{"staff"},
		Tool: "up__read", ToolName: "read", Upstream: "up", EvidenceClass: "spawn-measured",
		Annotations: Annotations{ReadOnly: true, Idempotent: true},
		Arguments:   []byte(`{"path":"/srv/x","count":3,"ratio":0.25,"force":false,"tags":["dev"],"opts":{"mode":"ro"},"n":null}`),
		Session:     Session{ID: "s1", Calls: 2, ToolsUsed: []string{"up__read"}},
		Time:        noon,
	}
}

func TestEveryAttribute(t *testing.T) {
	b := load(t, "testdata/attributes")
	if d := b.Decide(ptr(base())); !d.Allow || !slices.Equal(d.PolicyIDs, []string{"permit-all"}) || len(d.Errors) > 0 {
		t.Fatalf("base call: %+v", d)
	}
	cases := []struct {
		name string
		edit func(r *Request)
		want string
	}{
		{"principal", func(r *Request) { r.Agent = "mallory" }, "principal-eq"},
		{"group parent", func(r *Request) { r.Groups = []string{"staff", "banned"} }, "principal-group"},
		{"action list_tools", func(r *Request) { r.Agent = "blind"; r.Action = ActionListTools }, "action-list"},
		{"resource uid", func(r *Request) { r.Tool = "up__nuke" }, "resource-eq"},
		{"resource parent upstream", func(r *Request) { r.Upstream = "evil" }, "resource-parent"},
		{"tool name", func(r *Request) { r.ToolName = "rm" }, "tool-name"},
		{"tool upstream attr", func(r *Request) { r.Upstream = "shady" }, "tool-upstream"},
		{"evidence class", func(r *Request) { r.EvidenceClass = "plaintext" }, "tool-class"},
		{"readOnlyHint", func(r *Request) { r.Agent = "ro"; r.Annotations.ReadOnly = false }, "hint-readonly"},
		{"destructiveHint", func(r *Request) { r.Agent = "careful"; r.Annotations.Destructive = true }, "hint-destructive"},
		{"idempotentHint", func(r *Request) { r.Agent = "retrier"; r.Annotations.Idempotent = false }, "hint-idempotent"},
		{"openWorldHint", func(r *Request) { r.Agent = "offline"; r.Annotations.OpenWorld = true }, "hint-openworld"},
		{"session id", func(r *Request) { r.Session.ID = "s-bad" }, "session-id"},
		{"session calls", func(r *Request) { r.Session.Calls = 10 }, "session-calls"},
		{"session tools used", func(r *Request) { r.Session.ToolsUsed = []string{"up__secret"} }, "session-tools"},
		{"time", func(r *Request) { r.Time = time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC) }, "time"},
		{"argument string", func(r *Request) { r.Arguments = []byte(`{"path":"/etc/passwd"}`) }, "arg-string"},
		{"argument long", func(r *Request) { r.Arguments = []byte(`{"count":101}`) }, "arg-long"},
		{"argument decimal", func(r *Request) { r.Arguments = []byte(`{"ratio":0.75}`) }, "arg-decimal"},
		{"argument bool", func(r *Request) { r.Arguments = []byte(`{"force":true}`) }, "arg-bool"},
		{"argument array as set", func(r *Request) { r.Arguments = []byte(`{"tags":["dev","prod",null]}`) }, "arg-set"},
		{"argument nested record", func(r *Request) { r.Arguments = []byte(`{"opts":{"mode":"rw"}}`) }, "arg-record"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			tc.edit(&r)
			d := b.Decide(&r)
			if d.Allow || !slices.Equal(d.PolicyIDs, []string{tc.want}) {
				t.Fatalf("got %+v, want deny by %s", d, tc.want)
			}
			if !strings.Contains(d.Reason, tc.want) {
				t.Errorf("reason %q does not name %s", d.Reason, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestForbidThatErrorsDenies(t *testing.T) {
	sch, err := os.ReadFile("testdata/attributes/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	b := load(t, bundle(t, map[string]string{"schema.cedarschema": string(sch), "p.cedar": `@id("all") permit (principal, action, resource);
@id("doubled") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has count && context.arguments.count * 2 > 100 };
`}))
	// count * 2 overflows for a count of 2^62: an evaluation error. Cedar
	// would skip the forbid; we count it as matching.
	r := base()
	r.Arguments = []byte(`{"count":4611686018427387904}`)
	d := b.Decide(&r)
	if d.Allow || !slices.Equal(d.PolicyIDs, []string{"doubled"}) || len(d.Errors) != 1 || !strings.HasPrefix(d.Errors[0], "doubled: ") {
		t.Fatalf("got %+v", d)
	}
}

// rev65Policies forbid, with == and contains(), values of every
// type the converter makes; an argument sent with another JSON type than
// the schema declares (which the upstream may still read as the forbidden
// value) made each comparison false without an error.
const rev65Policies = `@id("allow") permit (principal, action, resource);
@id("no-1000") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has count && context.arguments.count == 1000 };
@id("no-1001") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has count && [1001, 1002].contains(context.arguments.count) };
@id("no-force") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has force && context.arguments.force == true };
@id("no-passwd") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has path && context.arguments.path == "/etc/passwd" };
@id("no-half") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has ratio && context.arguments.ratio == decimal("0.5") };
@id("no-prod") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has tags && context.arguments.tags.contains("prod") };
@id("no-rw") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has opts && context.arguments.opts has mode && context.arguments.opts.mode == "rw" };
`

// TestArgumentOfAnotherTypeDenies: an argument the schema declares, sent
// with another JSON type, denies the call whatever the policies compare,
// with a reason that names the declared attribute and the kinds and says
// what to send, and never repeats the value. Cached decisions agree.
func TestArgumentOfAnotherTypeDenies(t *testing.T) {
	sch, err := os.ReadFile("testdata/attributes/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	b := load(t, bundle(t, map[string]string{"schema.cedarschema": string(sch), "p.cedar": rev65Policies}))
	for _, tc := range []struct{ args, forbid string }{
		{`{"count":1000}`, "no-1000"},
		{`{"count":1001}`, "no-1001"},
		{`{"force":true}`, "no-force"},
		{`{"path":"/etc/passwd"}`, "no-passwd"},
		{`{"ratio":0.5}`, "no-half"},
		{`{"tags":["dev","prod"]}`, "no-prod"},
		{`{"opts":{"mode":"rw"}}`, "no-rw"},
	} {
		r := base()
		r.Arguments = []byte(tc.args)
		if d := b.Decide(&r); d.Allow || !slices.Equal(d.PolicyIDs, []string{tc.forbid}) {
			t.Fatalf("%s: got %+v, want deny by %s", tc.args, d, tc.forbid)
		}
	}
	cases := []struct{ args, want string }{
		{`{"count":1e3}`, `"count" must be a Long (the bundle's schema declares it); got a number written with a fraction or exponent: send it as an integer`},
		{`{"count":1001.0}`, `"count" must be a Long (the bundle's schema declares it); got a number written with a fraction or exponent: send it as an integer`},
		{`{"count":"1000"}`, `"count" must be a Long (the bundle's schema declares it); got a string: send a JSON integer`},
		{`{"count":[1000]}`, `"count" must be a Long (the bundle's schema declares it); got an array: send a JSON integer`},
		{`{"count":18446744073709552616}`, `"count" must be a Long (the bundle's schema declares it); got an integer outside the Long range: send an integer from -9223372036854775808 to 9223372036854775807`},
		{`{"force":"true"}`, `"force" must be a Bool (the bundle's schema declares it); got a string: send true or false`},
		{`{"force":1}`, `"force" must be a Bool (the bundle's schema declares it); got a number: send true or false`},
		{`{"path":["/etc/passwd"]}`, `"path" must be a String (the bundle's schema declares it); got an array: send a JSON string`},
		{`{"path":{"p":"/etc/passwd"}}`, `"path" must be a String (the bundle's schema declares it); got an object: send a JSON string`},
		{`{"path":1e3}`, `"path" must be a String (the bundle's schema declares it); got a number: send a JSON string`},
		{`{"ratio":"0.5"}`, `"ratio" must be a decimal (the bundle's schema declares it); got a string: send a JSON number with a decimal point and at most four digits after it, such as 1.5`},
		{`{"ratio":5e-1}`, `"ratio" must be a decimal (the bundle's schema declares it); got a number written with an exponent: send a JSON number`},
		{`{"ratio":0.50000}`, `"ratio" must be a decimal (the bundle's schema declares it); got a number with more than four digits after the point: send`},
		{`{"ratio":1}`, `"ratio" must be a decimal (the bundle's schema declares it); got an integer: send`},
		{`{"ratio":922337203685478.5}`, `"ratio" must be a decimal (the bundle's schema declares it); got a number outside the decimal range: send`},
		{`{"tags":"prod"}`, `"tags" must be a Set<String> (the bundle's schema declares it); got a string: send a JSON array`},
		{`{"tags":["dev",["prod"]]}`, `"tags[]" must be a String (the bundle's schema declares it); got an array: send a JSON string`},
		{`{"tags":[1,"prod"]}`, `"tags[]" must be a String (the bundle's schema declares it); got a number: send a JSON string`},
		{`{"opts":"rw"}`, `"opts" must be a record (the bundle's schema declares it); got a string: send a JSON object`},
		{`{"opts":{"mode":["rw"]}}`, `"opts.mode" must be a String (the bundle's schema declares it); got an array: send a JSON string`},
		{`{"items":[{"name":["big"]}]}`, `"items[].name" must be a String (the bundle's schema declares it); got an array: send a JSON string`},
		{`{"items":[{"size":1}]}`, `"items[].name" must be a String (the bundle's schema declares it, not optional); it is missing or null: send it`},
		{`{"items":[{"name":null}]}`, `"items[].name" must be a String (the bundle's schema declares it, not optional); it is missing or null: send it`},
		{`{"items":[{"name":"big","size":"1"}]}`, `"items[].size" must be a Long (the bundle's schema declares it); got a string: send a JSON integer`},
	}
	memo := b.NewLiveMemo()
	for _, tc := range cases {
		t.Run(tc.args, func(t *testing.T) {
			r := base()
			r.Arguments = []byte(tc.args)
			for _, d := range []Decision{b.Decide(&r), memo.Decide(&r), memo.Decide(&r)} {
				if d.Allow || len(d.PolicyIDs) != 0 || len(d.Errors) != 1 || !strings.HasPrefix(d.Errors[0], "arguments: "+tc.want) || d.Reason != "denied: "+d.Errors[0] {
					t.Fatalf("got %+v, want a deny: arguments: %s", d, tc.want)
				}
				for _, v := range []string{"1000", "1001", "1e3", "passwd", "prod", "rw", "big", "0.5", "5e-1", "922337203685478"} {
					if strings.Contains(d.Reason, v) {
						t.Fatalf("the reason repeats the value %q: %s", v, d.Reason)
					}
				}
			}
		})
	}
	// Every declared type, well formed, and whatever is not declared.
	for _, args := range []string{
		`{"count":-0,"force":false,"path":"","ratio":-922337203685477.5808,"tags":[],"opts":{},"items":[{"name":"x"}]}`,
		`{"count":null,"force":null,"path":null,"ratio":null,"tags":null,"opts":null,"items":null}`,
		`{"tags":[null,"dev"],"opts":{"mode":null,"extra":[1e3,{"x":"y"}]},"items":[{"name":"x","size":null,"extra":true},null]}`,
		`{"undeclared":1e3,"other":["prod",1000.0,{"a":[]}],"x":"1000"}`,
		`{"count":9223372036854775807,"ratio":1.0,"opts":{"mode":"ro"}}`,
	} {
		r := base()
		r.Arguments = []byte(args)
		if d := b.Decide(&r); !d.Allow || len(d.Errors) != 0 {
			t.Errorf("%s: got %+v, want allowed", args, d)
		}
	}
}

// TestUndeclaredMembersLeftOut: a member the schema does not declare, in
// a declared record, in a record inside a set or at the top, is left out of
// the record Cedar sees. Cedar compares records whole: kept, one member
// more would make a forbid's contains() or == miss while the upstream
// reads the value the forbid is about.
func TestUndeclaredMembersLeftOut(t *testing.T) {
	sch := strings.Replace(exampleSchema(t), "  path?: String,", "  path?: String,\n  ops?: Set<{ op: String }>,\n  target?: { host: String },\n  conf?: { host: String, port?: Long },", 1)
	b := load(t, bundle(t, map[string]string{"schema.cedarschema": sch, "p.cedar": `@id("all") permit (principal, action, resource);
@id("no-delete") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has ops && context.arguments.ops.contains({op: "delete"}) };
@id("no-prod") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has target && context.arguments.target == {host: "prod"} };
@id("has-declared") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has conf && context.arguments.conf has port };`}))
	// A CallArgs that declares nothing: the whole record compares.
	none := load(t, bundle(t, map[string]string{"schema.cedarschema": strings.Replace(exampleSchema(t), "  path?: String,", "", 1), "p.cedar": `@id("all") permit (principal, action, resource);
@id("args") forbid (principal, action == Action::"call_tool", resource) when { context.arguments == {} };`}))
	cases := []struct {
		name string
		b    *Bundle
		args string
		ids  []string // of the deny; nil: allowed by all
	}{
		{"set element as declared", b, `{"ops":[{"op":"delete"}]}`, []string{"no-delete"}},
		{"set element with a member more", b, `{"ops":[{"op":"read"},{"op":"delete","x":0}]}`, []string{"no-delete"}},
		{"set element with nested undeclared members", b, `{"ops":[{"x":{"y":[1e3,null]},"op":"delete","z":"a"}]}`, []string{"no-delete"}},
		{"record as declared", b, `{"target":{"host":"prod"}}`, []string{"no-prod"}},
		{"record with a member more", b, `{"target":{"host":"prod","x":true}}`, []string{"no-prod"}},
		{"record with a null and a member more", b, `{"target":{"host":"prod","port":null,"x":true},"y":1}`, []string{"no-prod"}},
		{"declared optional member still there", b, `{"conf":{"x":true,"host":"dev","port":22}}`, []string{"has-declared"}},
		{"other values allowed", b, `{"ops":[{"op":"read","x":0}],"target":{"host":"dev","x":1},"conf":{"host":"prod","port":null,"x":1},"other":{"op":"delete"}}`, nil},
		{"top level, nothing declared", none, `{"path":"/etc","x":{"y":1}}`, []string{"args"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			r.Arguments = []byte(tc.args)
			memo := tc.b.NewMemo()
			for _, d := range []Decision{tc.b.Decide(&r), memo.Decide(&r), memo.Decide(&r)} {
				if tc.ids == nil {
					if !d.Allow || len(d.Errors) > 0 {
						t.Fatalf("got %+v, want allowed", d)
					}
					continue
				}
				if d.Allow || !slices.Equal(d.PolicyIDs, tc.ids) || len(d.Errors) > 0 {
					t.Fatalf("got %+v, want denied by %v", d, tc.ids)
				}
			}
		})
	}
	// The limits and the form hold for undeclared members too.
	r := base()
	r.Arguments = []byte(`{"target":{"host":"dev","x":{"a":1,"a":2}}}`)
	if d := b.Decide(&r); d.Allow || !slices.Equal(d.Errors, []string{"arguments: a member name is repeated (in an object at depth 3)"}) {
		t.Fatalf("duplicate inside an undeclared member: got %+v", d)
	}
}

// TestArgumentTypesCheckedOnlyWhenRead: a bundle whose policies read no
// argument takes arguments of any type, even those its schema declares
// (the examples keep the template's path).
func TestArgumentTypesCheckedOnlyWhenRead(t *testing.T) {
	b := load(t, "../../examples/policy/allow-list")
	r := Request{Action: ActionCallTool, Agent: "alice", Tool: "git__log", Upstream: "git", Time: noon, Arguments: []byte(`{"path":["a","b"]}`)}
	if d := b.Decide(&r); !d.Allow {
		t.Fatalf("allow-list reads no argument: got %+v", d)
	}
	pg := load(t, "../../examples/policy/path-guard")
	r = Request{Action: ActionCallTool, Agent: "a", Tool: "fs__read", Upstream: "fs", Time: noon, Arguments: []byte(`{"path":["/srv/data/a","/etc/passwd"]}`)}
	if d := pg.Decide(&r); d.Allow || !strings.Contains(d.Reason, `"path" must be a String`) {
		t.Fatalf("path-guard reads path: got %+v", d)
	}
}

func TestArgumentLimits(t *testing.T) {
	b := load(t, "testdata/attributes")
	deep := strings.Repeat(`{"a":`, MaxArgumentDepth) + "1" + strings.Repeat("}", MaxArgumentDepth)
	tooDeep := strings.Repeat(`{"a":`, MaxArgumentDepth+1) + "1" + strings.Repeat("}", MaxArgumentDepth+1)
	many := `{"a":[` + strings.Repeat("1,", MaxArgumentValues) + `1]}`
	big := `{"a":"` + strings.Repeat("x", MaxArgumentBytes) + `"}`
	cases := []struct {
		name, args, want string
	}{
		{"at depth limit", deep, ""},
		{"past depth limit", tooDeep, "nested deeper than 32 levels"},
		{"too many values", many, "more than 10000 values"},
		{"too many bytes", big, "more than the policy limit of 1048576"},
		{"not an object", `[1]`, "not a JSON object"},
		{"duplicate member", `{"path":"/srv/x","path":"/etc/passwd"}`, "a member name is repeated (in an object at depth 1)"},
		{"bad json", `{"a":}`, "not valid JSON (at byte 5)"},
		{"trailing data", `{} {}`, "trailing data"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			r.Arguments = []byte(tc.args)
			d := b.Decide(&r)
			if tc.want == "" {
				if !d.Allow {
					t.Fatalf("got %+v", d)
				}
				return
			}
			if d.Allow || len(d.PolicyIDs) != 0 || !strings.Contains(d.Reason, tc.want) || !strings.Contains(d.Reason, "arguments") {
				t.Fatalf("got %+v, want deny mentioning %q", d, tc.want)
			}
		})
	}
}

// TestArgumentErrorsNameNothingOfThePayload: the errors and the reason of
// a decision go into the call record in clear, where the arguments are
// only a commitment, so an argument object refused for its form is named
// by fixed texts: no member name (a key can be a secret), no JSON pointer,
// no value; nor are the operands of an integer overflow, which may be
// argument values. So whether or not the bundle reads the arguments.
func TestArgumentErrorsNameNothingOfThePayload(t *testing.T) {
	sch, err := os.ReadFile("testdata/attributes/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	reads := load(t, bundle(t, map[string]string{"schema.cedarschema": string(sch), "p.cedar": `@id("all") permit (principal, action, resource);
@id("doubled") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has count && context.arguments.count * 2 > 100 };
`}))
	readsNone := load(t, bundle(t, map[string]string{"schema.cedarschema": string(sch), "p.cedar": `@id("all") permit (principal, action, resource);`}))
	deep := strings.Repeat(`{"sk-live-SECRET":`, MaxArgumentDepth+1) + "1" + strings.Repeat("}", MaxArgumentDepth+1)
	cases := []struct{ args, want string }{
		{`{"sk-live-SECRET":1,"sk-live-SECRET":2}`, "arguments: a member name is repeated (in an object at depth 1)"},
		{`{"a":[{"b":{"sk-live-SECRET":1,"sk-live-SECRET":2}}]}`, "arguments: a member name is repeated (in an object at depth 4)"},
		{"{\"sk-live-SECRET\":\"\xff\"}", "arguments: not valid UTF-8"},
		{"{\"sk-live-SECRET\xff\":1}", "arguments: not valid UTF-8"},
		{`{"sk-live-SECRET":}`, "arguments: not valid JSON (at byte 18)"},
		{`{"sk-live-SECRET":1`, "arguments: not valid JSON (at byte 19)"},
		{`{"sk-live-SECRET":[1,]}`, "arguments: not valid JSON (at byte 20)"},
		{deep, "arguments: nested deeper than 32 levels, the policy limit"},
	}
	for _, b := range []*Bundle{reads, readsNone} {
		for _, tc := range cases {
			r := base()
			r.Arguments = []byte(tc.args)
			d := b.Decide(&r)
			if d.Allow || !slices.Equal(d.Errors, []string{tc.want}) || d.Reason != "denied: "+tc.want {
				t.Errorf("%.60q: got %+v, want a deny: %s", tc.args, d, tc.want)
			}
		}
	}
	r := base()
	r.Arguments = []byte(`{"count":4611686018427387904}`)
	d := reads.Decide(&r)
	if d.Allow || !slices.Equal(d.Errors, []string{"doubled: integer overflow while attempting to multiply"}) {
		t.Errorf("overflow: got %+v", d)
	}
}

func TestExamples(t *testing.T) {
	type call struct {
		name  string
		req   Request
		allow bool
		ids   []string
	}
	mk := func(edit func(r *Request)) Request {
		r := Request{Action: ActionCallTool, Agent: "alice", Tool: "git__log", ToolName: "log", Upstream: "git",
			EvidenceClass: "spawn-measured", Annotations: DefaultAnnotations, Session: Session{ID: "s"}, Time: noon}
		edit(&r)
		return r
	}
	// read and prompt are read_resource and get_prompt on the same upstream.
	read := func(uri string, edit func(r *Request)) Request {
		return mk(func(r *Request) {
			r.Action, r.Tool, r.ToolName, r.Annotations, r.URI = ActionReadResource, "", "", Annotations{}, uri
			edit(r)
		})
	}
	prompt := func(name string, edit func(r *Request)) Request {
		return mk(func(r *Request) {
			r.Action, r.Tool, r.ToolName, r.Annotations, r.Prompt = ActionGetPrompt, "", "", Annotations{}, name
			edit(r)
		})
	}
	examples := map[string][]call{
		"allow-list": {
			{"alice on git", mk(func(r *Request) {}), true, []string{"alice-git"}},
			{"alice lists git", mk(func(r *Request) { r.Action = ActionListTools }), true, []string{"alice-git"}},
			{"alice on web", mk(func(r *Request) { r.Tool, r.Upstream = "web__search", "web" }), false, nil},
			{"bob on web search", mk(func(r *Request) { r.Agent, r.Tool, r.Upstream = "bob", "web__search", "web" }), true, []string{"bob-search"}},
			{"bob on git", mk(func(r *Request) { r.Agent = "bob" }), false, nil},
			{"carol in ops", mk(func(r *Request) { r.Agent, r.Groups = "carol", []string{"ops"} }), true, []string{"ops-everything"}},
			{"carol alone", mk(func(r *Request) { r.Agent = "carol" }), false, nil},
			{"alice reads git", read("git://x", func(r *Request) {}), true, []string{"alice-git"}},
			{"alice gets a git prompt", prompt("review", func(r *Request) {}), true, []string{"alice-git"}},
			{"alice reads web", read("https://x", func(r *Request) { r.Upstream = "web" }), false, nil},
			{"bob reads web: a tool permit is not the upstream", read("https://x", func(r *Request) { r.Agent, r.Upstream = "bob", "web" }), false, nil},
			{"carol in ops reads", read("git://x", func(r *Request) { r.Agent, r.Groups = "carol", []string{"ops"} }), true, []string{"ops-everything"}},
		},
		"path-guard": {
			{"inside", mk(func(r *Request) {
				r.Upstream, r.Tool, r.Arguments = "fs", "fs__read_file", []byte(`{"path":"/srv/data/a.txt"}`)
			}), true, []string{"fs-allowed"}},
			{"outside", mk(func(r *Request) {
				r.Upstream, r.Tool, r.Arguments = "fs", "fs__read_file", []byte(`{"path":"/etc/shadow"}`)
			}), false, []string{"fs-path-outside-data"}},
			{"dotdot", mk(func(r *Request) {
				r.Upstream, r.Tool, r.Arguments = "fs", "fs__read_file", []byte(`{"path":"/srv/data/../../etc/shadow"}`)
			}), false, []string{"fs-path-dotdot"}},
			{"no path argument", mk(func(r *Request) { r.Upstream, r.Tool, r.Arguments = "fs", "fs__list_roots", []byte(`{}`) }), true, []string{"fs-allowed"}},
			{"listing is not refused by the argument rules", mk(func(r *Request) { r.Upstream, r.Tool, r.Action = "fs", "fs__read_file", ActionListTools }), true, []string{"fs-allowed"}},
			{"other upstream", mk(func(r *Request) {}), false, nil},
			{"resource inside", read("file:///srv/data/a.txt", func(r *Request) { r.Upstream = "fs" }), true, []string{"fs-allowed"}},
			{"resource outside", read("file:///etc/shadow", func(r *Request) { r.Upstream = "fs" }), false, []string{"fs-uri-outside-data"}},
			{"resource dotdot", read("file:///srv/data/../../etc/shadow", func(r *Request) { r.Upstream = "fs" }), false, []string{"fs-uri-outside-data"}},
			{"prompt of fs", prompt("p", func(r *Request) { r.Upstream = "fs" }), true, []string{"fs-allowed"}},
		},
		"measured-only": {
			{"measured", mk(func(r *Request) {}), true, []string{"allow-all"}},
			{"pinned tls", mk(func(r *Request) { r.EvidenceClass = "tls-pinned" }), true, []string{"allow-all"}},
			{"unmeasured call", mk(func(r *Request) { r.EvidenceClass = "spawn-unmeasured" }), false, []string{"no-unmeasured-code"}},
			{"unmeasured list", mk(func(r *Request) { r.EvidenceClass, r.Action = "spawn-unmeasured", ActionListTools }), false, []string{"no-unmeasured-code"}},
			{"measured resource", read("x://a", func(r *Request) {}), true, []string{"allow-all"}},
			{"unmeasured resource", read("x://a", func(r *Request) { r.EvidenceClass = "spawn-unmeasured" }), false, []string{"no-unmeasured-code"}},
			{"unmeasured prompt", prompt("p", func(r *Request) { r.EvidenceClass = "spawn-unmeasured" }), false, []string{"no-unmeasured-code"}},
		},
		"read-only": {
			{"reporter read-only tool", mk(func(r *Request) { r.Agent, r.Annotations = "reporter", Annotations{ReadOnly: true} }), true, []string{"reporter-read-only"}},
			{"reporter default hints", mk(func(r *Request) { r.Agent = "reporter" }), false, nil},
			{"reporter read-only but destructive", mk(func(r *Request) { r.Agent, r.Annotations = "reporter", Annotations{ReadOnly: true, Destructive: true} }), false, nil},
			{"others anything", mk(func(r *Request) {}), true, []string{"everyone-else"}},
			{"reporter reads", read("x://a", func(r *Request) { r.Agent = "reporter" }), true, []string{"reporter-reads"}},
			{"reporter gets a prompt", prompt("p", func(r *Request) { r.Agent = "reporter" }), true, []string{"reporter-reads"}},
		},
		"session-limits": {
			{"fresh session", mk(func(r *Request) {}), true, []string{"allow-all"}},
			{"budget spent", mk(func(r *Request) { r.Session.Calls = 100 }), false, []string{"call-budget"}},
			{"post after read", mk(func(r *Request) { r.Tool, r.Session.ToolsUsed = "web__post", []string{"fs__read_file"} }), false, []string{"no-exfiltration"}},
			{"post without read", mk(func(r *Request) { r.Tool, r.Session.ToolsUsed = "web__post", []string{"git__log"} }), true, []string{"allow-all"}},
			{"contractor at noon", mk(func(r *Request) { r.Groups = []string{"contractors"} }), true, []string{"allow-all"}},
			{"contractor at night", mk(func(r *Request) { r.Groups, r.Time = []string{"contractors"}, noon.Add(10*time.Hour) }), false, []string{"contractor-hours"}},
			{"reads after the budget", read("x://a", func(r *Request) { r.Session.Calls = 100 }), true, []string{"allow-all"}},
		},
	}
	for name, calls := range examples {
		b := load(t, filepath.Join("../../examples/policy", name))
		for _, c := range calls {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				d := b.Decide(&c.req)
				if d.Allow != c.allow || !slices.Equal(d.PolicyIDs, c.ids) || len(d.Errors) > 0 {
					t.Fatalf("got %+v, want allow=%v ids=%v", d, c.allow, c.ids)
				}
			})
		}
	}
}

// bundle writes a bundle from name -> content into a temporary directory.
func bundle(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func exampleSchema(t *testing.T) string {
	b, err := os.ReadFile("../../examples/policy/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestLoadErrors(t *testing.T) {
	sch := exampleSchema(t)
	cases := []struct {
		name  string
		files map[string]string
		file  string
		line  int
		want  string
		code  int
	}{
		{"syntax", map[string]string{"schema.cedarschema": sch, "a.cedar": "permit (principal, action, resource);\n\npermit (principal, action, resource)\n  when { 1 ++ 2 };\n"},
			"a.cedar", 4, "syntax", exitcode.ExitConfig},
		{"unknown attribute", map[string]string{"schema.cedarschema": sch, "a.cedar": "permit (principal, action, resource);\n@id(\"x\")\nforbid (principal, action, resource) when { resource.owner == \"me\" };\n"},
			"a.cedar", 2, "attribute `owner` on entity type `Tool` not found", exitcode.ExitConfig},
		{"unguarded optional argument", map[string]string{"schema.cedarschema": sch, "a.cedar": "forbid (principal, action == Action::\"call_tool\", resource) when { context.arguments.path == \"/\" };\n"},
			"a.cedar", 1, "optional attribute `arguments.path`", exitcode.ExitConfig},
		{"unknown entity type", map[string]string{"schema.cedarschema": sch, "a.cedar": "permit (principal == User::\"x\", action, resource);\n"},
			"a.cedar", 1, "does not validate", exitcode.ExitConfig},
		{"duplicate id", map[string]string{"schema.cedarschema": sch, "a.cedar": "@id(\"p\") permit (principal, action, resource);\n", "b.cedar": "\n@id(\"p\") forbid (principal, action, resource);\n"},
			"b.cedar", 2, `policy id "p" is already used at a.cedar:1:1`, exitcode.ExitConfig},
		{"no schema", map[string]string{"a.cedar": "permit (principal, action, resource);"}, "", 0, "no .cedarschema", exitcode.ExitConfig},
		{"two schemas", map[string]string{"a.cedarschema": sch, "b.cedarschema": sch, "a.cedar": "permit (principal, action, resource);"}, "", 0, "more than one .cedarschema", exitcode.ExitConfig},
		{"no policies", map[string]string{"schema.cedarschema": sch}, "", 0, "no .cedar policy files", exitcode.ExitConfig},
		{"schema syntax", map[string]string{"schema.cedarschema": "entity Agent;\nentity", "a.cedar": "permit (principal, action, resource);"}, "schema.cedarschema", 2, "schema syntax", exitcode.ExitConfig},
		{"schema not the entity model", map[string]string{
			"schema.cedarschema": strings.Replace(sch, "  name: String,", "  name: Long,", 1), "a.cedar": "permit (principal, action, resource);"},
			"schema.cedarschema", 0, "does not describe the gateway's entity model", exitcode.ExitConfig},
		{"ipaddr argument", map[string]string{
			"schema.cedarschema": strings.Replace(sch, "  path?: String,", "  path?: String,\n  host?: ipaddr,", 1), "a.cedar": "permit (principal, action, resource);"},
			"schema.cedarschema", 0, `context.arguments: "host" is declared ipaddr, but no JSON argument converts to an ipaddr`, exitcode.ExitConfig},
		{"datetime in a set", map[string]string{
			"schema.cedarschema": strings.Replace(sch, "  path?: String,", "  path?: String,\n  when?: Set<datetime>,", 1), "a.cedar": "permit (principal, action, resource);"},
			"schema.cedarschema", 0, `"when[]" is declared datetime`, exitcode.ExitConfig},
		{"duration in a record", map[string]string{
			"schema.cedarschema": strings.Replace(sch, "  path?: String,", "  path?: String,\n  opts?: { ttl?: duration },", 1), "a.cedar": "permit (principal, action, resource);"},
			"schema.cedarschema", 0, `"opts.ttl" is declared duration`, exitcode.ExitConfig},
		{"entity argument", map[string]string{
			"schema.cedarschema": strings.Replace(sch, "  path?: String,", "  path?: String,\n  owner?: Agent,", 1), "a.cedar": "permit (principal, action, resource);"},
			"schema.cedarschema", 0, `"owner" is declared as the entity type Agent, but no JSON argument converts to an entity`, exitcode.ExitConfig},
		{"has on an undeclared argument", map[string]string{"schema.cedarschema": sch, "a.cedar": "permit (principal, action, resource);\n@id(\"x\")\nforbid (principal, action == Action::\"call_tool\", resource) when { context.arguments has debug };\n"},
			"a.cedar", 2, `context.arguments: "debug" is tested with has, but the schema's CallArgs does not declare it, so the test is always false`, exitcode.ExitConfig},
		{"has on an undeclared member of a declared record", map[string]string{
			"schema.cedarschema": strings.Replace(sch, "  path?: String,", "  path?: String,\n  target?: { host: String },", 1),
			"a.cedar":            "forbid (principal, action == Action::\"call_tool\", resource) when { context.arguments has target && context.arguments.target has port };\n"},
			"a.cedar", 1, `"target.port" is tested with has`, exitcode.ExitConfig},
		{"has through if and a record literal", map[string]string{
			"schema.cedarschema": strings.Replace(sch, "  path?: String,", "  path?: String,\n  target?: { host: String },", 1),
			"a.cedar":            "\nforbid (principal, action == Action::\"call_tool\", resource) when { context.arguments has target && {a: (if context.arguments has path then context.arguments.target else context.arguments.target)}.a has port };\n"},
			"a.cedar", 2, `"target.port" is tested with has`, exitcode.ExitConfig},
		{"has when CallArgs declares nothing", map[string]string{
			"schema.cedarschema": strings.Replace(sch, "  path?: String,", "", 1),
			"a.cedar":            "forbid (principal, action == Action::\"call_tool\", resource) when { {c: context}.c.arguments has path };\n"},
			"a.cedar", 1, `"path" is tested with has`, exitcode.ExitConfig},
		{"schema missing an action", map[string]string{
			"schema.cedarschema": sch[:strings.Index(sch, "action list_tools")], "a.cedar": "permit (principal, action, resource);"},
			"schema.cedarschema", 0, "list_tools", exitcode.ExitConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := bundle(t, tc.files)
			_, err := Load(context.Background(), dir, LoadOptions{})
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("got %v, want *LoadError", err)
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) || le.ExitCode() != tc.code {
				t.Fatalf("got %q (exit %d), want %q (exit %d)", err, le.ExitCode(), tc.want, tc.code)
			}
			wantFile := dir
			if tc.file != "" {
				wantFile = filepath.Join(dir, tc.file)
			}
			if le.File != wantFile || le.Line != tc.line {
				t.Fatalf("at %s:%d, want %s:%d (%v)", le.File, le.Line, wantFile, tc.line, err)
			}
		})
	}
}

func TestPin(t *testing.T) {
	dir := bundle(t, map[string]string{"schema.cedarschema": exampleSchema(t), "a.cedar": "permit (principal, action, resource);\n"})
	b, err := Load(context.Background(), dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(context.Background(), dir, LoadOptions{Expect: b.Digest()}); err != nil {
		t.Fatalf("matching pin: %v", err)
	}
	// Any file counts, not only policies.
	if err := os.WriteFile(filepath.Join(dir, "NOTES.md"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(context.Background(), dir, LoadOptions{Expect: b.Digest()})
	var le *LoadError
	if !errors.As(err, &le) || le.ExitCode() != exitcode.ExitMismatch || !strings.Contains(err.Error(), "does not match the pin "+b.Digest().String()) {
		t.Fatalf("got %v", err)
	}
	if h := le.Hints(); len(h) != 1 || !strings.Contains(h[0], "policy.expect: sha256:") {
		t.Fatalf("hints %q", h)
	}
	if _, err := Load(context.Background(), dir, LoadOptions{Expect: digest.Bytes([]byte("x"))}); err == nil {
		t.Fatal("wrong pin accepted")
	}
	// A pinned bundle edited into one that does not validate: the error is
	// the file, line and reason, never a hint to pin the broken bundle.
	if err := os.WriteFile(filepath.Join(dir, "b.cedar"), []byte("permit (principal, action, resource)\n  when { resource.owner == \"me\" };\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(context.Background(), dir, LoadOptions{Expect: b.Digest()})
	if err == nil || !strings.Contains(err.Error(), "b.cedar:1:") || !strings.Contains(err.Error(), "owner") || strings.Contains(err.Error(), "does not match the pin") {
		t.Fatalf("broken pinned bundle: got %v", err)
	}
	if errors.As(err, &le) {
		for _, h := range le.Hints() {
			if strings.Contains(h, "policy.expect") {
				t.Fatalf("hint offers to pin a bundle that does not validate: %q", h)
			}
		}
	}
}

func TestDefaultPolicyIDIsPosition(t *testing.T) {
	dir := bundle(t, map[string]string{"schema.cedarschema": exampleSchema(t), "sub/a.cedar": "permit (principal, action, resource);\n\n  forbid (principal == Agent::\"x\", action, resource);\n"})
	b := load(t, dir)
	if got := b.PolicyIDs(); !slices.Equal(got, []string{"sub/a.cedar:1:1", "sub/a.cedar:3:3"}) {
		t.Fatalf("ids %v", got)
	}
	r := base()
	r.Agent = "x"
	if d := b.Decide(&r); d.Allow || !slices.Equal(d.PolicyIDs, []string{"sub/a.cedar:3:3"}) {
		t.Fatalf("got %+v", d)
	}
}

func FuzzArgumentsRecord(f *testing.F) {
	for _, s := range []string{`{}`, `{"path":"/srv/data/a"}`, `{"a":[1,2.5,"x",null,{"b":true}]}`, `{"n":12345678901234567890}`, `{"x":1e3}`, `[]`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	b := load(f, "testdata/attributes")
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, err := ArgumentsRecord(raw)
		r := base()
		r.Arguments = raw
		d := b.Decide(&r)
		if err != nil && d.Allow {
			t.Fatalf("arguments %q rejected (%v) but the call was allowed", raw, err)
		}
	})
}

// FuzzLoad feeds policy texts (seeded with the examples) to Load: it must
// return a bundle or a *LoadError, never panic, and a bundle it returns must
// decide.
func FuzzLoad(f *testing.F) {
	files, _ := filepath.Glob("../../examples/policy/*/*.cedar")
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add(`permit (principal, action, resource) when { context.arguments has path };`)
	f.Add(`@id("x") forbid (principal in Group::"g", action, resource) unless { context.now.toTime() < duration("1h") };`)
	sch, err := os.ReadFile("../../examples/policy/schema.cedarschema")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text string) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "schema.cedarschema"), sch, 0o644)
		os.WriteFile(filepath.Join(dir, "p.cedar"), []byte(text), 0o644)
		b, err := Load(context.Background(), dir, LoadOptions{})
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || le.File == "" {
				t.Fatalf("error without a file: %v", err)
			}
			return
		}
		r := base()
		b.Decide(&r)
	})
}
