package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/replay"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

func engine(t *testing.T, dir string, mode policy.Mode) *policy.Engine {
	t.Helper()
	b, err := policy.Load(context.Background(), dir, policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return policy.NewEngine(b, mode, map[string][]string{"staff": {"agent-a"}})
}

var policyTokens = []Token{{Digest: TokenDigest("tok-a"), Identity: "agent-a"}, {Digest: TokenDigest("tok-r"), Identity: "reader"}}

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

func TestPolicyEnforcing(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	dir := policyBundle(t, testPolicy)
	eng := engine(t, dir, policy.Enforcing)
	h := newHarness(t, hconf{tokens: policyTokens, policy: eng, recipients: []string{id.Recipient().String()}})
	bundle := eng.Bundle().Digest().String()

	a := h.connect("tok-a", nil)
	if r, err := call(t, a, "t__echo", map[string]any{"text": "hi"}); err != nil || firstText(r) != "echo: hi" {
		t.Fatalf("allowed call: %v %v", r, err)
	}
	_, err := call(t, a, "t__echo", map[string]any{"text": "secret"})
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != CodeDenied || !strings.Contains(we.Message, "denied by no-secret") {
		t.Fatalf("denied call: %v", err)
	}
	var data struct {
		PolicyIDs []string `json:"policy_ids"`
		Bundle    string   `json:"bundle"`
	}
	if json.Unmarshal(we.Data, &data) != nil || !slices.Equal(data.PolicyIDs, []string{"no-secret"}) || data.Bundle != bundle {
		t.Fatalf("error data %s", we.Data)
	}

	// The reader sees and may call only read-only tools.
	r := h.connect("tok-r", nil)
	if got := toolNames(t, r); !slices.Equal(got, []string{"t__pid"}) {
		t.Fatalf("reader sees %v", got)
	}
	if got := toolNames(t, a); len(got) < 5 || !slices.Contains(got, "t__echo") {
		t.Fatalf("agent-a sees %v", got)
	}
	_, err = call(t, r, "t__echo", map[string]any{"text": "hi"})
	if wireCode(err) != CodeDenied || !strings.Contains(err.Error(), "default deny") {
		t.Fatalf("reader echo: %v", err)
	}

	recs := h.records()
	g := kinds(recs, "genesis")[0].Body
	if g["policy_digest"] != bundle || g["policy_mode"] != "enforcing" {
		t.Fatalf("genesis: %v", g)
	}
	if p := kinds(recs, "policy"); len(p) != 1 || p[0].Body["event"] != "loaded" || p[0].Body["bundle"] != bundle {
		t.Fatalf("policy records: %v", p)
	}
	calls := kinds(recs, "call")
	if len(calls) != 3 {
		t.Fatalf("%d call records", len(calls))
	}
	denied := calls[1].Body
	in, _ := denied["policy_input"].(map[string]any)
	if denied["decision"] != "deny" || denied["outcome"] != "refused" || denied["policy_mode"] != "enforcing" || denied["policy_bundle"] != bundle ||
		!slices.Equal(toStrings(denied["policy_ids"]), []string{"no-secret"}) || in == nil || in["session_calls"] != "1" ||
		!slices.Equal(toStrings(in["tools_used"]), []string{"t__echo"}) || in["evidence_class"] != "spawn-measured" || !slices.Equal(toStrings(in["groups"]), []string{"staff"}) {
		t.Fatalf("denied call record: %v", denied)
	}
	if h := calls[2].Body["policy_input"].(map[string]any)["hints"].(map[string]any); h["readOnlyHint"] != false || h["destructiveHint"] != true {
		t.Fatalf("hints %v", h)
	}
	// The reader's only call was denied: it never reached the upstream, so
	// no child was ever spawned for its session, and no result recorded.
	readerSession := calls[2].Body["session"]
	for _, sp := range kinds(recs, "spawn") {
		if sp.Body["session"] == readerSession {
			t.Fatalf("a child was spawned for the reader's session: %v", sp.Body)
		}
	}
	if n := len(kinds(recs, "result")); n != 1 {
		t.Fatalf("%d result records, want 1 (only the allowed call)", n)
	}
	// The pid tool is read-only: the reader may call it.
	if _, err := call(t, r, "t__pid", nil); err != nil {
		t.Fatalf("reader pid: %v", err)
	}

	// Replay over the real gateway's log: every decision is rebuilt.
	h.g.Shutdown(context.Background())
	h.w.Close()
	rep, err := replay.Run(context.Background(), h.dir, replay.Options{Policies: []string{dir}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Calls != 4 || rep.Summary.Same != 4 || rep.Findings() {
		t.Fatalf("replay: %+v", rep.Summary)
	}
	rep, err = replay.Run(context.Background(), h.dir, replay.Options{Policies: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.NotReplayable != 4 || rep.Findings() { // no-secret reads the arguments of every call
		t.Fatalf("replay without identity: %+v", rep.Summary)
	}
}

func toStrings(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// TestPolicyAdvisoryAndSilent: both modes forward a denied call and record
// the deny; advisory also tells the agent (a warning on the call's own
// stream) and the operator (the gateway log), silent tells neither.
func TestPolicyAdvisoryAndSilent(t *testing.T) {
	for _, mode := range []policy.Mode{policy.Advisory, policy.Silent} {
		for _, front := range fronts {
			t.Run(string(mode)+"/"+front, func(t *testing.T) {
				h := newHarness(t, hconf{tokens: policyTokens, policy: engine(t, policyBundle(t, testPolicy), mode)})
				var mu sync.Mutex
				var warnings []*mcp.LoggingMessageParams
				opts := &mcp.ClientOptions{LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
					mu.Lock()
					warnings = append(warnings, r.Params)
					mu.Unlock()
				}}
				var a *mcp.ClientSession
				if front == "http" {
					a = h.connect("tok-a", opts)
				} else {
					a = h.connectVia(front, opts)
				}
				r, err := call(t, a, "t__echo", map[string]any{"text": "secret"})
				if err != nil || firstText(r) != "echo: secret" {
					t.Fatalf("%s: the denied call must be forwarded: %v %v", mode, r, err)
				}
				eventually(t, 5*time.Second, func() string {
					if n := len(kinds(h.records(), "result")); n != 1 {
						return fmt.Sprintf("%d result records for the forwarded call, want 1", n)
					}
					return ""
				})
				c := kinds(h.records(), "call")[0].Body
				if c["decision"] != "deny" || c["outcome"] != "forwarded" || c["policy_mode"] != string(mode) {
					t.Fatalf("call record %v", c)
				}
				if front == "http" && !slices.Equal(toStrings(c["policy_ids"]), []string{"no-secret"}) {
					t.Fatalf("call record %v", c)
				}
				if mode == policy.Advisory {
					eventually(t, 5*time.Second, func() string {
						mu.Lock()
						defer mu.Unlock()
						for _, w := range warnings {
							d, _ := w.Data.(map[string]any)
							if w.Level == "warning" && w.Logger == "cmcp.policy" && d["mode"] == "advisory" && d["tool"] == "t__echo" && strings.Contains(fmt.Sprint(d["message"]), "advisory mode") {
								return ""
							}
						}
						return fmt.Sprintf("the agent was not warned: %v", warnings)
					})
				} else {
					time.Sleep(300 * time.Millisecond)
					mu.Lock()
					if len(warnings) != 0 {
						t.Fatalf("silent mode showed the agent %v", warnings)
					}
					mu.Unlock()
				}
				warned := strings.Contains(h.logs.String(), "policy would deny this call")
				if warned != (mode == policy.Advisory) {
					t.Fatalf("%s: operator warning %v", mode, warned)
				}
			})
		}
	}
}

func TestPolicyReload(t *testing.T) {
	dir := policyBundle(t, testPolicy)
	eng := engine(t, dir, policy.Enforcing)
	h := newHarness(t, hconf{tokens: policyTokens, policy: eng})
	old := eng.Bundle().Digest()
	a := h.connect("tok-a", nil)
	ctx := context.Background()

	// A bundle that does not validate: refused, recorded, old bundle kept.
	os.WriteFile(filepath.Join(dir, "policy.cedar"), []byte(`@id("x") permit (principal, action, resource) when { resource.owner == "me" };`), 0o644)
	err := h.g.ReloadPolicy(ctx, dir, digest.Digest{}, policy.Enforcing, nil)
	if err == nil || !strings.Contains(err.Error(), "policy.cedar:1:") {
		t.Fatalf("got %v", err)
	}
	if _, err := call(t, a, "t__echo", map[string]any{"text": "hi"}); err != nil {
		t.Fatalf("old bundle not kept: %v", err)
	}
	// A valid bundle with a pin it does not match: refused.
	os.WriteFile(filepath.Join(dir, "policy.cedar"), []byte(`@id("nothing") forbid (principal, action, resource);`+"\n"+`@id("all") permit (principal, action, resource);`), 0o644)
	if err := h.g.ReloadPolicy(ctx, dir, old, policy.Enforcing, nil); err == nil || !strings.Contains(err.Error(), "does not match the pin") {
		t.Fatalf("got %v", err)
	}
	// With its pin: in force, recorded with both digests.
	next, err := digest.Tree(ctx, dir, digest.TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.g.ReloadPolicy(ctx, dir, next, policy.Enforcing, nil); err != nil {
		t.Fatal(err)
	}
	_, err = call(t, a, "t__echo", map[string]any{"text": "hi"})
	if wireCode(err) != CodeDenied || !strings.Contains(err.Error(), "nothing") {
		t.Fatalf("new bundle not in force: %v", err)
	}
	if got := toolNames(t, a); len(got) != 0 {
		t.Fatalf("list not filtered by the new bundle: %v", got)
	}
	recs := h.records()
	var events []string
	for _, p := range kinds(recs, "policy") {
		events = append(events, p.Body["event"].(string))
		if p.Body["event"] != "loaded" && p.Body["previous"] != old.String() {
			t.Fatalf("policy record without the previous bundle: %v", p.Body)
		}
		if p.Body["event"] == "reloaded" && p.Body["bundle"] != next.String() {
			t.Fatalf("reloaded record: %v", p.Body)
		}
		if p.Body["event"] == "rejected" && p.Body["reason"] == nil {
			t.Fatalf("rejected without reason: %v", p.Body)
		}
	}
	if !slices.Equal(events, []string{"loaded", "rejected", "rejected", "reloaded"}) {
		t.Fatalf("policy events %v", events)
	}
	calls := kinds(recs, "call")
	if calls[0].Body["policy_bundle"] != old.String() || calls[1].Body["policy_bundle"] != next.String() {
		t.Fatalf("call bundles %v %v", calls[0].Body["policy_bundle"], calls[1].Body["policy_bundle"])
	}
}

// TestReplayCatchesFlipInGatewayLog rewrites the real gateway's log with
// the gateway's own key, flipping one decision: the forged log verifies, and
// only replay can tell, at the right record.
func TestReplayCatchesFlipInGatewayLog(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	dir := policyBundle(t, testPolicy)
	eng := engine(t, dir, policy.Enforcing)
	h := newHarness(t, hconf{tokens: policyTokens, policy: eng, recipients: []string{id.Recipient().String()}})
	a := h.connect("tok-a", nil)
	for _, text := range []string{"one", "secret", "two"} {
		call(t, a, "t__echo", map[string]any{"text": text})
	}
	h.g.Shutdown(context.Background())
	h.w.Close()

	// Forge: same key, every record copied, call 1 (denied) recorded as allowed.
	genesis, opener := readGenesis(t, h.dir, id)
	forged := t.TempDir()
	w, err := auditlog.Open(forged, auditlog.Options{Key: h.key, PolicyDigest: genesis.PolicyDigest, PolicyMode: genesis.PolicyMode,
		Gateway: genesis.Gateway, Recipients: []string{id.Recipient().String()}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	newIndex := map[int64]int64{}
	calls, flipped := 0, int64(-1)
	for _, e := range logEntries(t, h.dir) {
		switch e.Kind {
		case record.KindGenesis, record.KindCheckpoint, record.KindSeal, record.KindSegment, record.KindRecovery:
			continue
		}
		switch rec := e.Rec.(type) {
		case *record.Call:
			p, err := opener.Payload(rec.Args)
			if err != nil {
				t.Fatal(err)
			}
			rec.Args = w.Commit(p)
			if calls == 1 {
				if rec.Decision != "deny" {
					t.Fatalf("call 1 was %s", rec.Decision)
				}
				rec.Decision, rec.PolicyIDs, rec.Outcome = "allow", []string{"staff-calls"}, "forwarded"
			}
			calls++
		case *record.Result:
			rec.Call = newIndex[rec.Call]
			if !rec.Result.IsZero() {
				p, err := opener.Payload(rec.Result)
				if err != nil {
					t.Fatal(err)
				}
				rec.Result = w.Commit(p)
			}
		}
		rc, err := w.Append(context.Background(), e.Rec)
		if err != nil {
			t.Fatal(err)
		}
		newIndex[e.Index] = rc.Index
		if c, ok := e.Rec.(*record.Call); ok && c.Decision == "allow" && slices.Equal(c.PolicyIDs, []string{"staff-calls"}) && calls == 2 {
			flipped = rc.Index
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := auditlog.Verify(forged, auditlog.VerifyOptions{Keys: []string{w.VerifierKey()}}); err != nil {
		t.Fatalf("the forged log must verify with the gateway's key: %v", err)
	}
	rep, err := replay.Run(context.Background(), forged, replay.Options{Policies: []string{dir}, Identities: []age.Identity{id},
		Verify: auditlog.VerifyOptions{Keys: []string{w.VerifierKey()}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Differs != 1 || rep.Summary.Same != 2 || !rep.Findings() {
		t.Fatalf("replay: %+v", rep.Summary)
	}
	for _, c := range rep.Calls {
		if (c.Replay.Status == replay.StatusDiffers) != (c.Index == flipped) {
			t.Fatalf("record %d: %s (flipped record is %d)", c.Index, c.Replay.Status, flipped)
		}
		if c.Index == flipped && (c.Replay.Decision != "deny" || !slices.Equal(c.Replay.PolicyIDs, []string{"no-secret"})) {
			t.Fatalf("flipped record replays as %+v", c.Replay)
		}
	}
}

// TestDeniedCallNeverReachesUpstream: with a real child that writes down
// every call it receives, an enforcing deny is recorded and never arrives at
// the upstream, while an advisory deny is recorded and arrives.
func TestDeniedCallNeverReachesUpstream(t *testing.T) {
	for _, mode := range []policy.Mode{policy.Enforcing, policy.Advisory} {
		t.Run(string(mode), func(t *testing.T) {
			seen := filepath.Join(t.TempDir(), "seen")
			h := newHarness(t, hconf{tokens: policyTokens, policy: engine(t, policyBundle(t, testPolicy), mode), env: map[string]string{"CMCP_TEST_SEEN": seen}})
			a := h.connect("tok-a", nil)
			if _, err := call(t, a, "t__record", map[string]any{"text": "hello"}); err != nil {
				t.Fatal(err)
			}
			_, err := call(t, a, "t__record", map[string]any{"text": "secret"})
			if (mode == policy.Enforcing) != (wireCode(err) == CodeDenied) {
				t.Fatalf("%s: denied call returned %v", mode, err)
			}
			b, _ := os.ReadFile(seen)
			want := "hello\n"
			if mode == policy.Advisory {
				want = "hello\nsecret\n"
			}
			if string(b) != want {
				t.Fatalf("%s: the upstream received %q, want %q", mode, b, want)
			}
			calls := kinds(h.records(), "call")
			if len(calls) != 2 || calls[1].Body["decision"] != "deny" || !slices.Equal(toStrings(calls[1].Body["policy_ids"]), []string{"no-secret"}) {
				t.Fatalf("call records: %v", calls)
			}
			wantOutcome := map[policy.Mode]string{policy.Enforcing: "refused", policy.Advisory: "forwarded"}[mode]
			if calls[1].Body["outcome"] != wantOutcome {
				t.Fatalf("%s: outcome %v, want %s", mode, calls[1].Body["outcome"], wantOutcome)
			}
		})
	}
}

// TestPolicyReloadNotifiesAgents: a reload that changes what list_tools
// permits sends every connected agent notifications/tools/list_changed, and
// its next tools/list shows the new view.
func TestPolicyReloadNotifiesAgents(t *testing.T) {
	dir := policyBundle(t, testPolicy)
	eng := engine(t, dir, policy.Enforcing)
	h := newHarness(t, hconf{tokens: policyTokens, policy: eng})
	changed := make(chan struct{}, 8)
	r := h.connect("tok-r", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		changed <- struct{}{}
	}})
	if got := toolNames(t, r); !slices.Equal(got, []string{"t__pid"}) {
		t.Fatalf("reader sees %v before the reload", got)
	}
	// Let any notification from the session's start pass.
	time.Sleep(200 * time.Millisecond)
	for len(changed) > 0 {
		<-changed
	}
	next := strings.Replace(testPolicy, `unless { principal == Agent::"reader" && !resource.annotations.readOnlyHint };`, `;`, 1)
	if err := os.WriteFile(filepath.Join(dir, "policy.cedar"), []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.g.ReloadPolicy(context.Background(), dir, digest.Digest{}, policy.Enforcing, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no notifications/tools/list_changed after the reload")
	}
	if got := toolNames(t, r); len(got) < 5 || !slices.Contains(got, "t__echo") {
		t.Fatalf("reader sees %v after the reload, want every tool", got)
	}
}

// TestAgentGetsTheCommittedBytes: the result member an agent receives is
// byte for byte the payload the result record commits to (what the upstream
// sent), and the arguments commitment opens to the arguments as the agent
// sent them, through both fronts.
func TestAgentGetsTheCommittedBytes(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	h := newHarness(t, hconf{recipients: []string{id.Recipient().String()}})
	args := `{"text":"  spaced\u00e9 ",  "n": 1.50}`
	var got []json.RawMessage
	// HTTP front.
	cs := h.connect("", nil)
	req, _ := http.NewRequest("POST", h.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t__echo","arguments":`+args+`}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var m struct{ Result json.RawMessage }
	if err := json.Unmarshal(body, &m); err != nil || len(m.Result) == 0 {
		t.Fatalf("HTTP response %q: %v", body, err)
	}
	got = append(got, m.Result)
	// stdio front.
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go h.g.ServeStdio(context.Background(), inR, outW, "local")
	lines := bufio.NewScanner(outR)
	io.WriteString(inW, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`+"\n")
	lines.Scan()
	io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
	io.WriteString(inW, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t__echo","arguments":`+args+`}}`+"\n")
	lines.Scan()
	if err := json.Unmarshal(lines.Bytes(), &m); err != nil || len(m.Result) == 0 {
		t.Fatalf("stdio response %q: %v", lines.Text(), err)
	}
	got = append(got, m.Result)
	inW.Close()
	h.g.Shutdown(context.Background())
	h.w.Close()

	_, opener := readGenesis(t, h.dir, id)
	var results, arguments [][]byte
	for _, e := range logEntries(t, h.dir) {
		switch rec := e.Rec.(type) {
		case *record.Call:
			p, err := opener.Payload(rec.Args)
			if err != nil {
				t.Fatal(err)
			}
			arguments = append(arguments, p)
		case *record.Result:
			p, err := opener.Payload(rec.Result)
			if err != nil {
				t.Fatal(err)
			}
			results = append(results, p)
		}
	}
	if len(results) != 2 || len(arguments) != 2 {
		t.Fatalf("%d call and %d result records, want 2 and 2", len(arguments), len(results))
	}
	for i := range 2 {
		if !bytes.Equal(results[i], got[i]) {
			t.Errorf("call %d: the agent got\n%s\nbut the result record commits to\n%s", i, got[i], results[i])
		}
		if string(arguments[i]) != args {
			t.Errorf("call %d: the arguments commitment opens to %s, the agent sent %s", i, arguments[i], args)
		}
	}
}

// TestListChangedWhenFactsOrTimeChangeTheList: an agent is sent
// notifications/tools/list_changed when its own calls (session facts) or
// the time alone change what list_tools lets it see.
func TestListChangedWhenFactsOrTimeChangeTheList(t *testing.T) {
	// The time of day, in milliseconds, a moment from now: the policy hides
	// t__sleep until then.
	now := time.Now().UTC()
	midnight := now.Truncate(24 * time.Hour)
	flip := now.Add(3 * time.Second).Sub(midnight).Milliseconds()
	if flip >= 24*3600*1000-4000 {
		t.Skip("too close to midnight UTC for a time-of-day policy")
	}
	pol := fmt.Sprintf(`@id("allow-all")
permit (principal, action, resource);

@id("echo-budget")
forbid (principal, action == Action::"list_tools", resource == Tool::"t__echo")
when { context.session.calls >= 2 };

@id("sleep-later")
forbid (principal, action == Action::"list_tools", resource == Tool::"t__sleep")
when { context.now.toTime() < duration("%dms") };
`, flip)
	h := newHarness(t, hconf{tokens: policyTokens, policy: engine(t, policyBundle(t, pol), policy.Enforcing), listRecheck: 200 * time.Millisecond})
	changed := make(chan struct{}, 10)
	cs := h.connect("tok-a", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }})
	names := toolNames(t, cs)
	if !slices.Contains(names, "t__echo") || slices.Contains(names, "t__sleep") {
		t.Fatalf("first list: %v", names)
	}
	wait := func(what string) {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatalf("no tools/list_changed after %s", what)
		}
	}
	for range 2 {
		if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
			t.Fatal(err)
		}
	}
	wait("the session's second call")
	names = toolNames(t, cs)
	if slices.Contains(names, "t__echo") {
		t.Fatalf("after two calls t__echo is still listed: %v", names)
	}
	// On a slow machine the time may have passed already, and that
	// notification told the agent about both changes.
	if !slices.Contains(names, "t__sleep") {
		wait("the time passed the policy's hour")
		if names := toolNames(t, cs); !slices.Contains(names, "t__sleep") {
			t.Fatalf("after the time passed t__sleep is not listed: %v", names)
		}
	}
}

// TestArgumentOfAnotherTypeIsDenied: an argument sent with another JSON
// type than the bundle's schema declares ({"count":1e3} for a Long, which
// the upstream reads as 1000, so a forbid on count == 1000 would not see
// it) is denied, the same way in every mode as arguments past the limits:
// enforcing refuses it and tells the agent what to send, advisory records
// the deny and forwards. The call record holds the deny and its reason, not
// the value, and replay re-decides it to the same deny.
func TestArgumentOfAnotherTypeIsDenied(t *testing.T) {
	const pol = `@id("all") permit (principal, action, resource);
@id("no-1000") forbid (principal, action == Action::"call_tool", resource) when { context.arguments has count && context.arguments.count == 1000 };
`
	dir := policyBundle(t, pol)
	sch, err := os.ReadFile(filepath.Join(dir, "schema.cedarschema"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "schema.cedarschema"), []byte(strings.Replace(string(sch), "  text?: String,", "  text?: String,\n  count?: Long,", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	const want = `arguments: \"count\" must be a Long (the bundle's schema declares it); got a number written with a fraction or exponent: send it as an integer`
	for _, mode := range []policy.Mode{policy.Enforcing, policy.Advisory} {
		t.Run(string(mode), func(t *testing.T) {
			id, _ := age.GenerateX25519Identity()
			seen := filepath.Join(t.TempDir(), "seen")
			h := newHarness(t, hconf{policy: engine(t, dir, mode), recipients: []string{id.Recipient().String()}, env: map[string]string{"CMCP_TEST_SEEN": seen}})
			send := rawSender(t, h, "http") // the response, not the advisory warning before it
			for i, args := range []string{`{"text":"a","count":5}`, `{"text":"b","count":1000}`, `{"text":"c","count":1e3}`, `{"text":"d","count":1000.0}`} {
				resp := send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"t__record","arguments":%s}}`, 10+i, args))
				refused := strings.Contains(resp, `"error"`)
				if refused != (mode == policy.Enforcing && i > 0) {
					t.Fatalf("%s: %s", args, resp)
				}
				if refused && i > 1 && !strings.Contains(resp, want) {
					t.Fatalf("%s: the agent is not told what to send: %s", args, resp)
				}
			}
			wantSeen := "a\n"
			if mode == policy.Advisory {
				wantSeen = "a\nb\nc\nd\n"
			}
			eventually(t, 5*time.Second, func() string {
				if b, _ := os.ReadFile(seen); string(b) != wantSeen {
					return fmt.Sprintf("the upstream received %q, want %q", b, wantSeen)
				}
				return ""
			})
			calls := kinds(h.records(), "call")
			if len(calls) != 4 {
				t.Fatalf("%d call records", len(calls))
			}
			for _, c := range calls[2:] {
				b := c.Body
				in, _ := b["policy_input"].(map[string]any)
				errs := toStrings(in["errors"])
				if b["decision"] != "deny" || b["policy_mode"] != string(mode) || len(toStrings(b["policy_ids"])) != 0 || len(errs) != 1 || errs[0] != strings.ReplaceAll(want, `\"`, `"`) {
					t.Fatalf("call record %v", b)
				}
				if mode == policy.Enforcing && (b["outcome"] != "refused" || !strings.Contains(fmt.Sprint(b["reason"]), errs[0])) {
					t.Fatalf("call record %v", b)
				}
				if mode == policy.Advisory && b["outcome"] != "forwarded" {
					t.Fatalf("call record %v", b)
				}
			}
			h.g.Shutdown(context.Background())
			h.w.Close()
			rep, err := replay.Run(context.Background(), h.dir, replay.Options{Policies: []string{dir}, Identities: []age.Identity{id}})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Summary.Calls != 4 || rep.Summary.Same != 4 || rep.Findings() {
				t.Fatalf("replay: %+v", rep.Summary)
			}
			for _, c := range rep.Calls[2:] {
				if c.Replay.Decision != "deny" || !strings.Contains(c.Replay.Reason, "must be a Long") {
					t.Fatalf("replay of record %d: %+v", c.Index, c.Replay)
				}
			}
		})
	}
}

// TestRefusedArgumentsLeaveNoNameInTheLog: arguments refused for their
// form (a repeated member name, nesting too deep, invalid UTF-8) are
// recorded with a reason and errors that hold nothing of the payload: a
// member name that is a secret appears in no file of the audit log, where
// the arguments are only a commitment (and sealed in the vault).
func TestRefusedArgumentsLeaveNoNameInTheLog(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	dir := policyBundle(t, testPolicy+"\n@id(\"all\") permit (principal, action, resource);\n")
	h := newHarness(t, hconf{policy: engine(t, dir, policy.Enforcing), recipients: []string{id.Recipient().String()}})
	send := rawSender(t, h, "http")
	deep := strings.Repeat(`{"sk-live-SECRET-NAME":`, policy.MaxArgumentDepth+1) + "1" + strings.Repeat("}", policy.MaxArgumentDepth+1)
	refused := []string{
		`{"text":"a","sk-live-SECRET-NAME":1,"sk-live-SECRET-NAME":2}`,
		`{"text":"a","x":{"sk-live-SECRET-NAME":1,"sk-live-SECRET-NAME":2}}`,
		deep,
		"{\"text\":\"a\",\"sk-live-SECRET-NAME\":\"\xff\"}",
	}
	for i, args := range refused {
		resp := send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"t__echo","arguments":%s}}`, 10+i, args))
		if !strings.Contains(resp, `"error"`) || !strings.Contains(resp, "arguments: ") || strings.Contains(resp, "SECRET") {
			t.Fatalf("%.60s: %s", args, resp)
		}
	}
	calls := kinds(h.records(), "call")
	if len(calls) != len(refused) {
		t.Fatalf("%d call records, want %d", len(calls), len(refused))
	}
	for i, c := range calls {
		// A repeated member name (the first two) and text that is not
		// UTF-8 (the last) are refused by the front before the policy sees
		// the call (TestRepeatedMemberNamesInACallAreRefused,
		// TestAgentTextThatIsNotUTF8IsRefused): its record has a reason but
		// no policy input.
		in, _ := c.Body["policy_input"].(map[string]any)
		if c.Body["decision"] != "deny" || c.Body["outcome"] != "refused" || (i == 2) != (len(toStrings(in["errors"])) == 1) || !strings.Contains(fmt.Sprint(c.Body["reason"]), "arguments: ") {
			t.Fatalf("call record %v", c.Body)
		}
	}
	h.g.Shutdown(context.Background())
	h.w.Close()
	err := filepath.WalkDir(h.dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if i := bytes.Index(b, []byte("SECRET")); i >= 0 {
			t.Errorf("%s holds the member name in clear: %q", p, b[max(0, i-80):min(len(b), i+40)])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
