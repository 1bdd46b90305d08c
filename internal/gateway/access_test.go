package gateway

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/replay"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// toolsOnly permits tools to everyone and nothing else: resources and
// prompts fall under the default deny.
const toolsOnly = `
@id("tools")
permit (principal, action in [Action::"call_tool", Action::"list_tools"], resource);
`

func accessCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestAccessDeniedByDefault: with a bundle that permits only tools, an
// agent can neither read a resource nor get a prompt, through either
// front; each refusal is a policy denial (the call's code, the policies in
// its data), recorded in an access record before anything reaches the
// upstream, with the URI committed, never in clear. The lists show none
// of them.
func TestAccessDeniedByDefault(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			dir := policyBundle(t, toolsOnly)
			eng := engine(t, dir, policy.Enforcing)
			h := newHarness(t, hconf{policy: eng})
			cs := h.connectVia(front, nil)
			ctx := accessCtx(t)

			if _, err := call(t, cs, "t__echo", map[string]any{"text": "hi"}); err != nil {
				t.Fatalf("tools stay allowed: %v", err)
			}
			_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"})
			if wireCode(err) != CodeDenied || !strings.Contains(err.Error(), "default deny") || !strings.Contains(err.Error(), `upstream "t"`) {
				t.Fatalf("resources/read: %v", err)
			}
			_, err = cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "t__greet", Arguments: map[string]string{"who": "bob"}})
			if wireCode(err) != CodeDenied || !strings.Contains(err.Error(), `prompt "t__greet"`) {
				t.Fatalf("prompts/get: %v", err)
			}
			_, err = cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "t__greet"}, Argument: mcp.CompleteParamsArgument{Name: "who", Value: "b"}})
			if wireCode(err) != CodeDenied {
				t.Fatalf("completion/complete: %v", err)
			}
			if lr, err := cs.ListResources(ctx, nil); err != nil || len(lr.Resources) != 0 {
				t.Fatalf("resources/list: %v %v", lr, err)
			}
			if lt, err := cs.ListResourceTemplates(ctx, nil); err != nil || len(lt.ResourceTemplates) != 0 {
				t.Fatalf("resources/templates/list: %v %v", lt, err)
			}
			if lp, err := cs.ListPrompts(ctx, nil); err != nil || len(lp.Prompts) != 0 {
				t.Fatalf("prompts/list: %v %v", lp, err)
			}

			acc := kinds(h.records(), "access")
			if len(acc) != 3 {
				t.Fatalf("%d access records, want 3: %v", len(acc), acc)
			}
			want := []struct{ method, action, prompt string }{
				{"resources/read", "read_resource", ""}, {"prompts/get", "get_prompt", "greet"}, {"completion/complete", "get_prompt", "greet"},
			}
			bundle := eng.Bundle().Digest().String()
			for i, r := range acc {
				b := r.Body
				in, _ := b["policy_input"].(map[string]any)
				if b["method"] != want[i].method || b["action"] != want[i].action || b["decision"] != "deny" || b["outcome"] != "refused" ||
					b["policy_mode"] != "enforcing" || b["policy_bundle"] != bundle || b["upstream"] != "t" || b["agent"] == "" || b["session"] == "" ||
					in == nil || in["session_calls"] != "1" || !strings.Contains(b["reason"].(string), "default deny") {
					t.Fatalf("access record %d: %v", i, b)
				}
				if p, _ := b["prompt"].(string); p != want[i].prompt {
					t.Fatalf("access record %d prompt %q", i, p)
				}
			}
			if acc[0].Body["uri"] == nil || acc[1].Body["uri"] != nil || acc[1].Body["args"] == nil || acc[2].Body["args"] == nil {
				t.Fatalf("commitments: %v / %v / %v", acc[0].Body, acc[1].Body, acc[2].Body)
			}
			// The URI is a payload: in the log only as its commitment.
			segs, _ := filepath.Glob(filepath.Join(h.dir, "*", "seg-*.jsonl"))
			for _, f := range segs {
				if b, _ := os.ReadFile(f); strings.Contains(string(b), "test://static") {
					t.Fatalf("%s holds the URI in clear", f)
				}
			}
		})
	}
}

// TestAccessAllowedRecordedAndFiltered: a bundle that lets the agent read
// one resource (by URI) and one prompt shows only those in the lists, and
// records an allowed read before it is forwarded: when the log cannot
// record, the read is refused.
func TestAccessAllowedRecordedAndFiltered(t *testing.T) {
	dir := policyBundle(t, toolsOnly+`
@id("static-only")
permit (principal, action == Action::"read_resource", resource in Upstream::"t")
when { context.uri == "test://static" };

@id("greet-only")
permit (principal, action == Action::"get_prompt", resource in Upstream::"t")
when { context.prompt == "greet" };
`)
	eng := engine(t, dir, policy.Enforcing)
	h := newHarness(t, hconf{policy: eng})
	cs := h.connect("", nil)
	ctx := accessCtx(t)

	lr, err := cs.ListResources(ctx, nil)
	if err != nil || len(lr.Resources) != 1 || lr.Resources[0].URI != "test://static" {
		t.Fatalf("resources/list: %v %v", lr, err)
	}
	if lt, err := cs.ListResourceTemplates(ctx, nil); err != nil || len(lt.ResourceTemplates) != 0 {
		t.Fatalf("resources/templates/list: %v %v", lt, err)
	}
	lp, err := cs.ListPrompts(ctx, nil)
	if err != nil || len(lp.Prompts) != 1 || lp.Prompts[0].Name != "t__greet" {
		t.Fatalf("prompts/list: %v %v", lp, err)
	}
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "static text" {
		t.Fatalf("allowed read: %v %v", rr, err)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://item/7"}); wireCode(err) != CodeDenied {
		t.Fatalf("other uri: %v", err)
	}
	gp, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "t__greet", Arguments: map[string]string{"who": "bob"}})
	if err != nil || len(gp.Messages) != 1 {
		t.Fatalf("allowed prompt: %v %v", gp, err)
	}
	acc := kinds(h.records(), "access")
	if len(acc) != 3 || acc[0].Body["decision"] != "allow" || acc[0].Body["outcome"] != "forwarded" ||
		!slices.Equal(toStrings(acc[0].Body["policy_ids"]), []string{"static-only"}) ||
		acc[1].Body["outcome"] != "refused" || acc[2].Body["outcome"] != "forwarded" || acc[2].Body["prompt"] != "greet" {
		t.Fatalf("access records: %v", acc)
	}

	// The log becomes unwritable: an allowed read is refused, not forwarded
	// unrecorded.
	if err := h.w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}); wireCode(err) != CodeAuditUnavailable {
		t.Fatalf("read with a broken log: %v", err)
	}
	if _, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "t__greet"}); wireCode(err) != CodeAuditUnavailable {
		t.Fatalf("prompt with a broken log: %v", err)
	}
}

// TestAccessRefusedWhoseRecordFailsIsAuditUnavailable: a read the policy
// denies is answered -32063, not its denial, when its refused record
// cannot be written: the agent learns the log is down, as for a call.
func TestAccessRefusedWhoseRecordFailsIsAuditUnavailable(t *testing.T) {
	dir := policyBundle(t, toolsOnly)
	h := newHarness(t, hconf{policy: engine(t, dir, policy.Enforcing)})
	cs := h.connect("", nil)
	ctx := accessCtx(t)
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}); wireCode(err) != CodeDenied {
		t.Fatalf("denied read: %v", err)
	}
	if err := h.w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}); wireCode(err) != CodeAuditUnavailable {
		t.Fatalf("denied read with a broken log: %v, want %d", err, CodeAuditUnavailable)
	}
	if _, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "t__greet"}); wireCode(err) != CodeAuditUnavailable {
		t.Fatalf("denied prompt with a broken log: %v, want %d", err, CodeAuditUnavailable)
	}
}

// TestAccessAdvisory: advisory mode forwards a denied read and records the
// deny as forwarded.
func TestAccessAdvisory(t *testing.T) {
	for _, mode := range []policy.Mode{policy.Advisory, policy.Silent} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, hconf{policy: engine(t, policyBundle(t, toolsOnly), mode)})
			cs := h.connect("", nil)
			ctx := accessCtx(t)
			if rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}); err != nil || len(rr.Contents) != 1 {
				t.Fatalf("read: %v %v", rr, err)
			}
			acc := kinds(h.records(), "access")
			if len(acc) != 1 || acc[0].Body["decision"] != "deny" || acc[0].Body["outcome"] != "forwarded" || acc[0].Body["policy_mode"] != string(mode) {
				t.Fatalf("access records: %v", acc)
			}
			warned := strings.Contains(h.logs.String(), "advisory mode: forwarded")
			if warned != (mode == policy.Advisory) {
				t.Fatalf("operator warned %v in mode %s", warned, mode)
			}
		})
	}
}

// TestAccessMeasuredOnly: the measured-only example forbids reading the
// resources and getting the prompts of an upstream spawned without a pin.
func TestAccessMeasuredOnly(t *testing.T) {
	eng := engine(t, "../../examples/policy/measured-only", policy.Enforcing)
	var zero digest.Digest
	h := newHarness(t, hconf{pin: &zero, unmeasured: true, policy: eng})
	cs := h.connect("", nil)
	ctx := accessCtx(t)
	_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"})
	if wireCode(err) != CodeDenied || !strings.Contains(err.Error(), "no-unmeasured-code") {
		t.Fatalf("read: %v", err)
	}
	if _, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "t__greet"}); wireCode(err) != CodeDenied {
		t.Fatalf("prompt: %v", err)
	}
	if lr, err := cs.ListResources(ctx, nil); err != nil || len(lr.Resources) != 0 {
		t.Fatalf("resources/list: %v %v", lr, err)
	}
	acc := kinds(h.records(), "access")
	if len(acc) != 2 || acc[0].Body["evidence_class"] != "spawn-unmeasured" || !slices.Equal(toStrings(acc[0].Body["policy_ids"]), []string{"no-unmeasured-code"}) {
		t.Fatalf("access records: %v", acc)
	}
}

// TestReplayAccessRecords: replay re-decides access records against the
// recorded bundle (same) and finds the decisions another bundle would
// change; a bundle that reads context.uri needs the vault.
func TestReplayAccessRecords(t *testing.T) {
	dir := policyBundle(t, toolsOnly+`
@id("reads")
permit (principal, action in [Action::"read_resource", Action::"get_prompt"], resource);
`)
	id, _ := age.GenerateX25519Identity()
	h := newHarness(t, hconf{policy: engine(t, dir, policy.Enforcing), recipients: []string{id.Recipient().String()}})
	cs := h.connect("", nil)
	ctx := accessCtx(t)
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "t__greet"}); err != nil {
		t.Fatal(err)
	}
	h.g.Shutdown(context.Background())
	h.w.Close()

	rep, err := replay.Run(context.Background(), h.dir, replay.Options{Policies: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Accesses != 2 || rep.Summary.Same != 2 || rep.Findings() {
		t.Fatalf("replay: %+v", rep.Summary)
	}
	next := policyBundle(t, toolsOnly)
	rep, err = replay.Run(context.Background(), h.dir, replay.Options{WhatIf: next})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Changes != 2 {
		t.Fatalf("what-if: %+v", rep.Summary)
	}
	// A bundle that reads the URI cannot be checked without the vault.
	uri := policyBundle(t, toolsOnly+`
@id("static") permit (principal, action == Action::"read_resource", resource) when { context.uri == "test://static" };
`)
	rep, err = replay.Run(context.Background(), h.dir, replay.Options{WhatIf: uri})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.WhatIfNotEvaluated != 1 || rep.Summary.NotReplayable != 0 || rep.Summary.Changes != 1 {
		t.Fatalf("what-if on the uri: %+v", rep.Summary)
	}
	// With the auditor's identity the URI comes from the vault: the read
	// stays allowed, the prompt would be denied.
	rep, err = replay.Run(context.Background(), h.dir, replay.Options{WhatIf: uri, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.NotReplayable != 0 || rep.Summary.WhatIfNotEvaluated != 0 || rep.Summary.Changes != 1 || rep.Calls[0].WhatIf.Status != replay.StatusUnchanged || rep.Calls[1].WhatIf.Status != replay.StatusChanges {
		t.Fatalf("what-if on the uri with the vault: %+v", rep.Summary)
	}
}

// TestReplayReDecidesAPromptByItsName: replay asks the bundle with the
// recorded prompt name: a get the bundle permits by that name replays
// as the same decision (asked without it, the bundle denies).
func TestReplayReDecidesAPromptByItsName(t *testing.T) {
	dir := policyBundle(t, toolsOnly+`
@id("greet-only")
permit (principal, action == Action::"get_prompt", resource) when { context.prompt == "greet" };
`)
	h := newHarness(t, hconf{policy: engine(t, dir, policy.Enforcing)})
	cs := h.connect("", nil)
	ctx := accessCtx(t)
	if _, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "t__greet"}); err != nil {
		t.Fatal(err)
	}
	h.g.Shutdown(context.Background())
	h.w.Close()
	rep, err := replay.Run(context.Background(), h.dir, replay.Options{Policies: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Accesses != 1 || rep.Summary.Same != 1 || rep.Findings() {
		t.Fatalf("replay: %+v", rep.Summary)
	}
}

// TestAccessReloadNotifies: a policy reload may change what the resource
// and prompt lists show: every agent is told to list them again.
func TestAccessReloadNotifies(t *testing.T) {
	dir := policyBundle(t, toolsOnly)
	h := newHarness(t, hconf{policy: engine(t, dir, policy.Enforcing)})
	prompts, resources := make(chan struct{}, 8), make(chan struct{}, 8)
	cs := h.connect("", &mcp.ClientOptions{
		PromptListChangedHandler:   func(context.Context, *mcp.PromptListChangedRequest) { prompts <- struct{}{} },
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { resources <- struct{}{} },
	})
	ctx := accessCtx(t)
	if lp, err := cs.ListPrompts(ctx, nil); err != nil || len(lp.Prompts) != 0 {
		t.Fatalf("prompts before: %v %v", lp, err)
	}
	time.Sleep(200 * time.Millisecond)
	for len(prompts) > 0 {
		<-prompts
	}
	for len(resources) > 0 {
		<-resources
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.cedar"), []byte(toolsOnly+`
@id("reads") permit (principal, action in [Action::"read_resource", Action::"get_prompt"], resource);
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.g.ReloadPolicy(context.Background(), dir, digest.Digest{}, policy.Enforcing, nil); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan struct{}{"prompts": prompts, "resources": resources} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no notifications/%s/list_changed after the reload", name)
		}
	}
	if lp, err := cs.ListPrompts(ctx, nil); err != nil || len(lp.Prompts) == 0 {
		t.Fatalf("prompts after: %v %v", lp, err)
	}
}
