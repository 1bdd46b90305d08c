package replay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

type testCall struct {
	call policy.Call
	args string
}

func calls() []testCall {
	fs := func(agent, session, path string) testCall {
		return testCall{policy.Call{Agent: agent, Session: session, Tool: "fs__read_file", ToolName: "read_file", Upstream: "fs",
			EvidenceClass: "spawn-measured", Annotations: policy.Annotations{ReadOnly: true}}, `{"path":"` + path + `"}`}
	}
	git := func(agent, session, tool string, ro bool) testCall {
		return testCall{policy.Call{Agent: agent, Session: session, Tool: "git__" + tool, ToolName: tool, Upstream: "git",
			EvidenceClass: "spawn-measured", Annotations: policy.Annotations{ReadOnly: ro, Destructive: !ro}}, `{}`}
	}
	return []testCall{
		fs("alice", "s1", "/srv/data/a.txt"), // 0 allow
		fs("alice", "s1", "/etc/passwd"),     // 1 deny fs-outside-data
		git("alice", "s1", "log", true),      // 2 allow alice-git
		git("alice", "s1", "push", false),    // 3 allow alice-git; what-if: deny
		git("bob", "s2", "log", true),        // 4 deny; what-if: allow
		fs("bob", "s2", "/srv/data/b.txt"),   // 5 allow
	}
}

type logFixture struct {
	dir      string
	key      ed25519.PrivateKey
	identity *age.X25519Identity
	bundle   *policy.Bundle
	callIdx  []int64 // record index of each call record
}

// writeLog decides the calls with the real engine and writes them with the
// real audit writer, as the gateway does. flip, if >= 0, records the
// opposite decision for that call (a gateway whose memory was tampered
// with, or a log rewritten with the real key).
func writeLog(t *testing.T, key ed25519.PrivateKey, id *age.X25519Identity, flip int) *logFixture {
	t.Helper()
	b, err := policy.Load(context.Background(), "testdata/recorded", policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := &logFixture{dir: t.TempDir(), key: key, identity: id, bundle: b}
	opts := auditlog.Options{Key: key, PolicyDigest: b.Digest(), PolicyMode: "enforcing", Durability: record.DurabilityGroup}
	if id != nil {
		opts.Recipients = []string{id.Recipient().String()}
		opts.Vault = true
	}
	w, err := auditlog.Open(f.dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eng := policy.NewEngine(b, policy.Enforcing, nil)
	for _, s := range []string{"s1", "s2"} {
		if _, err := w.Append(ctx, &record.Session{ID: s, Event: "start", Agent: map[string]string{"s1": "alice", "s2": "bob"}[s]}); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range calls() {
		c.call.Arguments = []byte(c.args)
		o := eng.DecideCall(c.call)
		rec := &record.Call{Session: c.call.Session, Agent: c.call.Agent, Tool: c.call.Tool, Upstream: c.call.Upstream,
			UpstreamTool: c.call.ToolName, EvidenceClass: c.call.EvidenceClass, Args: w.Commit([]byte(c.args)),
			Decision: o.Effect(), PolicyIDs: o.PolicyIDs, PolicyMode: string(o.Mode), PolicyBundle: o.Bundle,
			Outcome: record.OutcomeForwarded, PolicyInput: o.Input()}
		if o.Refuse {
			rec.Outcome, rec.Reason = record.OutcomeRefused, o.Reason
		}
		if i == flip {
			rec.Decision = map[string]string{"allow": "deny", "deny": "allow"}[rec.Decision]
		}
		rc, err := w.Append(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		f.callIdx = append(f.callIdx, rc.Index)
		if rec.Outcome == record.OutcomeForwarded {
			if _, err := w.Append(ctx, &record.Result{Call: rc.Index, Session: rec.Session, Outcome: record.ResultOK, LatencyMicros: 1200, Result: w.Commit([]byte(`{"content":[]}`))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return f
}

func newKeys(t *testing.T) (ed25519.PrivateKey, *age.X25519Identity) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return key, id
}

func statuses(rep *Report, what func(*Call) *Check) []string {
	var s []string
	for _, c := range rep.Calls {
		s = append(s, what(c).Status)
	}
	return s
}

func replayOf(c *Call) *Check { return c.Replay }
func whatIfOf(c *Call) *Check { return c.WhatIf }

func TestReplayIdentical(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	ctx := context.Background()

	// With the identity every decision is rebuilt, including those that
	// depend on the path argument.
	rep, err := Run(ctx, f.dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(statuses(rep, replayOf), " "); got != "same same same same same same" || rep.Findings() {
		t.Fatalf("statuses %s", got)
	}
	if c := rep.Calls[1]; c.Decision != "deny" || c.Outcome != "refused" || c.Replay.PolicyIDs[0] != "fs-outside-data" {
		t.Fatalf("call 1: %+v %+v", c, c.Replay)
	}
	if c := rep.Calls[0]; c.Result != "ok" || c.LatencyMicros != 1200 || c.Index != f.callIdx[0] {
		t.Fatalf("call 0: %+v", c)
	}
	if len(rep.Sessions) != 2 || rep.Sessions[0].Calls != 4 || rep.Sessions[1].Calls != 2 {
		t.Fatalf("sessions %+v %+v", rep.Sessions[0], rep.Sessions[1])
	}

	// Without it no call is replayable: the bundle reads path, so it checks
	// the declared argument types at every call, git's too (a git call
	// sending {"path":5} is denied).
	rep, err = Run(ctx, f.dir, Options{Policies: []string{"testdata/recorded"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(statuses(rep, replayOf), " "); got != "not-replayable not-replayable not-replayable not-replayable not-replayable not-replayable" || rep.Findings() {
		t.Fatalf("statuses %s", got)
	}
	if !strings.Contains(rep.Calls[0].Replay.Reason, "--identity") {
		t.Fatalf("reason %q", rep.Calls[0].Replay.Reason)
	}

	// Filters.
	rep, err = Run(ctx, f.dir, Options{Filter: Filter{Agent: "alice", Decision: "allow"}})
	if err != nil || len(rep.Calls) != 3 {
		t.Fatalf("filter: %d calls, %v", len(rep.Calls), err)
	}
	rep, err = Run(ctx, f.dir, Options{Filter: Filter{Session: "s2", Tool: "git__log"}})
	if err != nil || len(rep.Calls) != 1 || rep.Calls[0].Agent != "bob" {
		t.Fatalf("filter: %+v, %v", rep.Calls, err)
	}
}

func TestReplayCatchesFlippedDecision(t *testing.T) {
	key, id := newKeys(t)
	// Call 4 (bob on git) was denied; the log says allow. The log is signed
	// with the real key: it verifies, and only replay can catch the flip.
	f := writeLog(t, key, id, 4)
	rep, err := Run(context.Background(), f.dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	// Call 5 (bob's next) was decided with tools_used [], which the flipped
	// record (an allow: its tool let through) contradicts.
	if got := strings.Join(statuses(rep, replayOf), " "); got != "same same same same differs inconsistent" || !rep.Findings() || rep.Summary.Differs != 1 {
		t.Fatalf("statuses %s", got)
	}
	c := rep.Calls[4]
	if want := fmt.Sprintf("(git__log from record %d)", c.Index); !strings.Contains(rep.Calls[5].Inconsistent, want) {
		t.Fatalf("call 5: %q, want %q", rep.Calls[5].Inconsistent, want)
	}
	if c.Index != f.callIdx[4] || c.Decision != "allow" || c.Replay.Decision != "deny" || !strings.Contains(c.Replay.Reason, "recorded allow") {
		t.Fatalf("flipped call: %+v %+v", c, c.Replay)
	}
}

func TestWhatIf(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	rep, err := Run(context.Background(), f.dir, Options{WhatIf: "testdata/next", Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(statuses(rep, whatIfOf), " "); got != "unchanged unchanged unchanged changes changes unchanged" || rep.Summary.Changes != 2 || rep.Findings() {
		t.Fatalf("statuses %s", got)
	}
	if c := rep.Calls[3].WhatIf; c.Decision != "deny" {
		t.Fatalf("%+v", c)
	}
	if c := rep.Calls[4].WhatIf; c.Decision != "allow" || c.PolicyIDs[0] != "git-read-only" {
		t.Fatalf("%+v", c)
	}
}

// TestWhatIfSeesArgumentTypeDenials: a bundle that reads the arguments
// checks the types its schema declares at every call, whatever the tool.
// Calls to git, recorded under a bundle that reads no argument, what-if'ed
// against testdata/next (path?: String, read only by a forbid on fs): the
// one sending {"path":5} would be denied at the gateway, and what-if says
// so with the payloads; without them no git call is guessed. Before, the
// payload was opened only when an argument-reading policy's scope matched
// the call, and the call was reported an unchanged allow.
func TestWhatIfSeesArgumentTypeDenials(t *testing.T) {
	key, id := newKeys(t)
	ctx := context.Background()
	old := t.TempDir()
	sch, err := os.ReadFile("testdata/recorded/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(old, "schema.cedarschema"), sch, 0o644)
	os.WriteFile(filepath.Join(old, "policy.cedar"), []byte(`@id("alice-git") permit (principal == Agent::"alice", action, resource in Upstream::"git");`), 0o644)
	b, err := policy.Load(ctx, old, policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	next, err := policy.Load(ctx, "testdata/next", policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, PolicyDigest: b.Digest(), PolicyMode: "enforcing", Durability: record.DurabilityGroup,
		Recipients: []string{id.Recipient().String()}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "alice"}); err != nil {
		t.Fatal(err)
	}
	args := []string{`{"path":5}`, `{"path":"/srv"}`, `{}`}
	wantLive := []string{"deny", "allow", "allow"}
	for i, a := range args {
		call := policy.Call{Agent: "alice", Session: "s1", Tool: "git__log", ToolName: "log", Upstream: "git",
			EvidenceClass: "spawn-measured", Annotations: policy.Annotations{ReadOnly: true}, Arguments: []byte(a)}
		// What the gateway running the next bundle decides.
		if live := policy.NewEngine(next, policy.Enforcing, nil).DecideCall(call); live.Effect() != wantLive[i] {
			t.Fatalf("%s: the next bundle decides %s %v", a, live.Effect(), live.Errors)
		}
		o := policy.NewEngine(b, policy.Enforcing, nil).DecideCall(call)
		rc, err := w.Append(ctx, &record.Call{Session: "s1", Agent: "alice", Tool: call.Tool, Upstream: "git", UpstreamTool: "log",
			EvidenceClass: call.EvidenceClass, Args: w.Commit(call.Arguments), Decision: o.Effect(), PolicyIDs: o.PolicyIDs,
			PolicyMode: string(o.Mode), PolicyBundle: o.Bundle, Outcome: record.OutcomeForwarded, PolicyInput: o.Input()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(ctx, &record.Result{Call: rc.Index, Session: "s1", Outcome: record.ResultOK, Result: w.Commit([]byte(`{"content":[]}`))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	rep, err := Run(ctx, dir, Options{WhatIf: "testdata/next", Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(statuses(rep, whatIfOf), " "); got != "changes unchanged unchanged" || rep.Summary.Changes != 1 {
		t.Fatalf("with the payloads: %s", got)
	}
	if c := rep.Calls[0]; c.Decision != "allow" || c.WhatIf.Decision != "deny" || !strings.Contains(c.WhatIf.Reason, `arguments: "path" must be a String`) {
		t.Fatalf("with the payloads: %+v %+v", c, c.WhatIf)
	}

	rep, err = Run(ctx, dir, Options{WhatIf: "testdata/next"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(statuses(rep, whatIfOf), " "); got != "not-replayable not-replayable not-replayable" || rep.Summary.Changes != 0 {
		t.Fatalf("without the payloads: %s", got)
	}
	if r := rep.Calls[0].WhatIf.Reason; !strings.Contains(r, "--identity") {
		t.Fatalf("without the payloads: %q", r)
	}
}

func TestReplayRefusesOtherBundle(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	_, err := Run(context.Background(), f.dir, Options{Policies: []string{"testdata/next"}})
	var ue *exitcode.Error
	if !errors.As(err, &ue) || ue.Code != exitcode.ExitMismatch || !strings.Contains(err.Error(), "which the log never recorded (recorded: "+f.bundle.Digest().String()) {
		t.Fatalf("got %v", err)
	}
}

func TestReplayTamperedVault(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	// Whoever holds the auditors' public key can write a vault line: replace
	// the payload of call 1 (/etc/passwd, denied) with an allowed path.
	vault := filepath.Join(f.dir, "epoch-000001", auditlog.VaultFile)
	data, err := os.ReadFile(vault)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	replaced := false
	for sc.Scan() {
		var vl struct {
			ID  int64  `json:"id,string"`
			Age []byte `json:"age"`
		}
		if err := json.Unmarshal(sc.Bytes(), &vl); err != nil {
			t.Fatal(err)
		}
		r, err := age.Decrypt(bytes.NewReader(vl.Age), id)
		if err != nil {
			t.Fatal(err)
		}
		var p bytes.Buffer
		p.ReadFrom(r)
		if p.String() == `{"path":"/etc/passwd"}` {
			var enc bytes.Buffer
			w, _ := age.Encrypt(&enc, id.Recipient())
			w.Write([]byte(`{"path":"/srv/data/x"}`))
			w.Close()
			vl.Age = enc.Bytes()
			replaced = true
		}
		line, _ := json.Marshal(vl)
		out.Write(line)
		out.WriteByte('\n')
	}
	if !replaced {
		t.Fatal("payload not found in the vault")
	}
	if err := os.WriteFile(vault, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), f.dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(statuses(rep, replayOf), " "); got != "same tampered same same same same" || rep.Summary.Tampered != 1 || !rep.Findings() {
		t.Fatalf("statuses %s", got)
	}
	if !strings.Contains(rep.Calls[1].Replay.Reason, "do not match the commitment") {
		t.Fatalf("%+v", rep.Calls[1].Replay)
	}
}

func TestReplayRefusesUnverifiedLog(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	seg := filepath.Join(f.dir, "epoch-000001", "seg-000001.jsonl")
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite bob's denied git call as carol's: the line stays canonical,
	// but its hash no longer matches the chain and the tree.
	i := bytes.Index(data, []byte(`"agent":"bob","args"`))
	if i < 0 {
		t.Fatal("bob's call not found")
	}
	copy(data[i:], `"agent":"bod"`)
	if err := os.WriteFile(seg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), f.dir, Options{Policies: []string{"testdata/recorded"}})
	var nv *NotVerifiedError
	if !errors.As(err, &nv) || nv.ExitCode() != exitcode.ExitLogInteg || !strings.Contains(strings.Join(exitcode.HintsOf(err), " "), "--unverified") {
		t.Fatalf("got %v", err)
	}
	rep, err := Run(context.Background(), f.dir, Options{Policies: []string{"testdata/recorded"}, Unverified: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Unverified == "" || !strings.Contains(rep.Unverified, "integrity") {
		t.Fatalf("unverified %q", rep.Unverified)
	}
	for _, c := range rep.Calls {
		if !c.Unverified {
			t.Fatalf("call %d not marked", c.Index)
		}
	}
	for _, s := range rep.Sessions {
		if !s.Unverified {
			t.Fatalf("session %s not marked", s.ID)
		}
	}
}

func TestReplayWarnsOnSessionFactGaps(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	rep, err := Run(context.Background(), f.dir, Options{})
	if err != nil || len(ownWarnings(rep)) != 0 {
		t.Fatalf("%v %v", rep.Warnings, err)
	}
	// A log whose session s1 lacks a decided call (the second one): the
	// remaining calls' session_calls are 0, 2, 3.
	f2 := writeLogSkipping(t, key, id, 1)
	rep, err = Run(context.Background(), f2, Options{})
	if w := ownWarnings(rep); err != nil || len(w) != 1 || !strings.Contains(w[0], "session s1") {
		t.Fatalf("%v %v", rep.Warnings, err)
	}
}

// writeLogSkipping writes the log of calls() but leaves out call skip's
// record, as a gateway that decided it and crashed before recording it.
func writeLogSkipping(t *testing.T, key ed25519.PrivateKey, id *age.X25519Identity, skip int) string {
	t.Helper()
	b, err := policy.Load(context.Background(), "testdata/recorded", policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, PolicyDigest: b.Digest(), PolicyMode: "enforcing"})
	if err != nil {
		t.Fatal(err)
	}
	eng := policy.NewEngine(b, policy.Enforcing, nil)
	for i, c := range calls() {
		c.call.Arguments = []byte(c.args)
		o := eng.DecideCall(c.call)
		if i == skip {
			continue
		}
		rec := &record.Call{Session: c.call.Session, Agent: c.call.Agent, Tool: c.call.Tool, Upstream: c.call.Upstream,
			UpstreamTool: c.call.ToolName, EvidenceClass: c.call.EvidenceClass, Args: w.Commit([]byte(c.args)),
			Decision: o.Effect(), PolicyIDs: o.PolicyIDs, PolicyMode: string(o.Mode), PolicyBundle: o.Bundle,
			Outcome: record.OutcomeRefused, PolicyInput: o.Input()}
		if _, err := w.Append(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReplayWarnsOfATornVault: a vault whose last line was cut off (the
// gateway stopped while writing it) is still read, and the report says that
// a payload was lost instead of passing over it.
func TestReplayWarnsOfATornVault(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	vault := filepath.Join(f.dir, "epoch-000001", auditlog.VaultFile)
	data, err := os.ReadFile(vault)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vault, data[:len(data)-20], 0o600); err != nil {
		t.Fatal(err)
	}
	last := bytes.LastIndexByte(data[:len(data)-1], '\n') + 1
	rep, err := Run(context.Background(), f.dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("ends with an incomplete line of %d bytes", len(data)-20-last)
	if w := ownWarnings(rep); len(w) != 1 || !strings.Contains(w[0], want) {
		t.Fatalf("warnings %q, want one with %q", rep.Warnings, want)
	}
	if rep.Summary.Tampered != 0 || rep.Summary.Differs != 0 {
		t.Fatalf("summary %+v", rep.Summary)
	}
}

// TestNotCheckedSaysWhy: a call that cannot be re-decided carries a short
// cause (Check.Why) without the call's particulars, the same for every call
// with that cause, saying what to do; a call decided by a bundle not given
// names its digest; an identity that opens no epoch's vault is one warning
// for the epoch, with the error.
func TestNotCheckedSaysWhy(t *testing.T) {
	key, id := newKeys(t)
	f := writeLog(t, key, id, -1)
	rep, err := Run(context.Background(), f.dir, Options{Policies: []string{"testdata/recorded"}})
	if err != nil {
		t.Fatal(err)
	}
	const noID = "its decision reads the arguments: pass --identity with an age identity the log's payloads are encrypted to"
	for _, i := range []int{0, 1, 5} {
		if ck := rep.Calls[i].Replay; ck.Status != StatusNotReplayable || ck.Why != noID {
			t.Errorf("call %d: %+v", i, ck)
		}
	}
	other, _ := age.GenerateX25519Identity()
	rep, err = Run(context.Background(), f.dir, Options{Policies: []string{"testdata/recorded"}, Identities: []age.Identity{other}})
	if err != nil {
		t.Fatal(err)
	}
	if ck := rep.Calls[0].Replay; ck.Status != StatusNotReplayable || ck.Why != "its decision reads the arguments, and epoch 1's payload vault cannot be opened (see the warning)" {
		t.Errorf("other identity: %+v", ck)
	}
	var warned []string
	for _, w := range rep.Warnings {
		if strings.Contains(w, "payload vault cannot be opened") {
			warned = append(warned, w)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "epoch 1") || !strings.Contains(warned[0], "did not match any of the recipients") {
		t.Errorf("warnings: %q", rep.Warnings)
	}

	// A second bundle put in force by a reload, and a call it decided.
	b2, err := policy.Load(context.Background(), "testdata/next", policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, PolicyDigest: f.bundle.Digest(), PolicyMode: "enforcing"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "alice"})
	w.Append(ctx, &record.Policy{Event: "reloaded", Bundle: b2.Digest(), Previous: f.bundle.Digest(), Mode: "enforcing"})
	c := calls()[2]
	c.call.Arguments = []byte(c.args)
	o := policy.NewEngine(b2, policy.Enforcing, nil).DecideCall(c.call)
	rec := &record.Call{Session: "s1", Agent: "alice", Tool: c.call.Tool, Upstream: c.call.Upstream, UpstreamTool: c.call.ToolName,
		EvidenceClass: c.call.EvidenceClass, Args: w.Commit([]byte(c.args)), Decision: o.Effect(), PolicyIDs: o.PolicyIDs,
		PolicyMode: string(o.Mode), PolicyBundle: o.Bundle, Outcome: record.OutcomeForwarded, PolicyInput: o.Input()}
	if o.Refuse {
		rec.Outcome = record.OutcomeRefused
	}
	w.Append(ctx, rec)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err = Run(context.Background(), dir, Options{Policies: []string{"testdata/recorded"}})
	if err != nil {
		t.Fatal(err)
	}
	if ck := rep.Calls[0].Replay; ck.Status != StatusNoBundle || ck.Why != "decided by bundle "+b2.Digest().String()+": pass it with --policy" {
		t.Errorf("no bundle: %+v", ck)
	}
}
