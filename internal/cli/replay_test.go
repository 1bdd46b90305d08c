package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/ui"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// replayLog writes a small log as the gateway would: decided by the real
// engine with examples/policy/path-guard, payloads sealed to id. flip
// records the opposite decision for that call.
func replayLog(t *testing.T, id *age.X25519Identity, flip int) string {
	t.Helper()
	return replayLogWith(t, id, func(i int, rec *record.Call) bool {
		if i == flip {
			rec.Decision = "allow"
		}
		return rec.Outcome == record.OutcomeForwarded
	})
}

// replayLogWith writes replayLog's log, with mut rewriting call i's record
// before it is appended and saying whether a result follows.
func replayLogWith(t *testing.T, id *age.X25519Identity, mut func(i int, rec *record.Call) bool) string {
	t.Helper()
	const bundleDir = "../../examples/policy/path-guard"
	b, err := policy.Load(context.Background(), bundleDir, policy.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := t.TempDir()
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, PolicyDigest: b.Digest(), PolicyMode: "enforcing",
		Recipients: []string{id.Recipient().String()}, Vault: true})
	if err != nil {
		t.Fatal(err)
	}
	eng := policy.NewEngine(b, policy.Enforcing, nil)
	ctx := context.Background()
	w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "alice", Front: "http"})
	for i, path := range []string{"/srv/data/a", "/etc/passwd", "/srv/data/b"} {
		args := []byte(`{"path":"` + path + `"}`)
		c := policy.Call{Agent: "alice", Session: "s1", Tool: "fs__read_file", ToolName: "read_file", Upstream: "fs", EvidenceClass: "spawn-measured", Arguments: args}
		o := eng.DecideCall(c)
		rec := &record.Call{Session: "s1", Agent: "alice", Tool: c.Tool, Upstream: "fs", UpstreamTool: c.ToolName, EvidenceClass: c.EvidenceClass,
			Args: w.Commit(args), Decision: o.Effect(), PolicyIDs: o.PolicyIDs, PolicyMode: string(o.Mode), PolicyBundle: o.Bundle,
			Outcome: record.OutcomeForwarded, PolicyInput: o.Input()}
		if o.Refuse {
			rec.Outcome = record.OutcomeRefused
		}
		withResult := mut(i, rec)
		rc, err := w.Append(ctx, rec)
		if err != nil {
			t.Fatal(err)
		}
		if withResult {
			w.Append(ctx, &record.Result{Call: rc.Index, Session: "s1", Outcome: record.ResultOK, LatencyMicros: 1500})
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func run(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := Main(args, strings.NewReader(""), &out, &errb)
	noteSchemaFailure(checkJSONOutput(args, out.Bytes()))
	return out.String(), errb.String(), code
}

func TestReplayCommand(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	idFile := filepath.Join(t.TempDir(), "auditor.key")
	if err := os.WriteFile(idFile, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const bundle = "../../examples/policy/path-guard"
	log := replayLog(t, id, -1)

	out, errs, code := run("replay", log)
	if code != 0 || !strings.Contains(out, "fs__read_file") || !strings.Contains(out, "fs-path-outside-data") || !strings.Contains(out, "forwarded/ok") || !strings.Contains(out, "4 calls") && !strings.Contains(out, "3 calls") {
		t.Fatalf("timeline: code %d\n%s\n%s", code, out, errs)
	}

	out, errs, code = run("replay", log, "--policy", bundle)
	if code != 0 || !strings.Contains(out, "0 same, 0 differ, 3 not replayable") {
		t.Fatalf("without identity: code %d\n%s\n%s", code, out, errs)
	}
	out, errs, code = run("replay", log, "--policy", bundle, "--identity", idFile)
	if code != 0 || !strings.Contains(out, "3 same, 0 differ, 0 not replayable") {
		t.Fatalf("with identity: code %d\n%s\n%s", code, out, errs)
	}

	out, errs, code = run("-o", "json", "replay", log, "--policy", bundle, "--identity", idFile, "--decision", "deny")
	var doc struct {
		SchemaVersion int `json:"schema_version"`
		Calls         []struct {
			Decision string   `json:"decision"`
			Policies []string `json:"policy_ids"`
			Replay   struct{ Status string }
		} `json:"calls"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || doc.SchemaVersion != ui.SchemaVersion || len(doc.Calls) != 1 || doc.Calls[0].Replay.Status != "same" {
		t.Fatalf("json: code %d\n%s\n%s", code, out, errs)
	}

	flipped := replayLog(t, id, 1)
	out, errs, code = run("replay", flipped, "--policy", bundle, "--identity", idFile)
	if code != exitcode.ExitReplay || !strings.Contains(out, "differs: recorded allow by [fs-path-outside-data], replay gives deny") || !strings.Contains(errs, "1 decision(s) that differ") {
		t.Fatalf("flipped: code %d\n%s\n%s", code, out, errs)
	}

	_, errs, code = run("replay", log, "--policy", "../../examples/policy/allow-list")
	if code != exitcode.ExitMismatch || !strings.Contains(errs, "--what-if") {
		t.Fatalf("other bundle: code %d\n%s", code, errs)
	}
	out, errs, code = run("replay", log, "--what-if", "../../examples/policy/allow-list", "--identity", idFile)
	if code != 0 || !strings.Contains(out, "changes to deny") || !strings.Contains(out, "2 would change") {
		t.Fatalf("what-if: code %d\n%s\n%s", code, out, errs)
	}
	// A log that does not verify is refused, or replayed with every line marked.
	seg := filepath.Join(log, "epoch-000001", "seg-000001.jsonl")
	data, _ := os.ReadFile(seg)
	data = bytes.Replace(data, []byte(`"front":"http"`), []byte(`"front":"htt0"`), 1)
	os.WriteFile(seg, data, 0o644)
	_, errs, code = run("replay", log)
	if code != exitcode.ExitLogInteg || !strings.Contains(errs, "--unverified") {
		t.Fatalf("unverified log: code %d\n%s", code, errs)
	}
	out, errs, code = run("replay", log, "--unverified")
	if code != 0 || !strings.Contains(errs, "UNVERIFIED") {
		t.Fatalf("--unverified: code %d\n%s\n%s", code, out, errs)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(line, "│") && !strings.Contains(line, "UNVERIFIED") || !strings.HasPrefix(line, "│") && !strings.HasPrefix(line, "┌") && !strings.HasPrefix(line, "├") && !strings.HasPrefix(line, "└") && !strings.HasPrefix(line, "UNVERIFIED") {
			t.Fatalf("line not marked: %q", line)
		}
	}

	_, errs, code = run("replay", log, "--decision", "maybe")
	if code != exitcode.ExitUsage {
		t.Fatalf("bad flag: code %d %s", code, errs)
	}
}

// TestReplayFilters: --since, --until, --agent, --session and --tool select
// calls of a real log through the command line, and a time that is not RFC
// 3339 is a usage error naming the flag.
func TestReplayFilters(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	log := replayLog(t, id, -1)
	calls := func(args ...string) []int64 {
		t.Helper()
		out, errs, code := run(append([]string{"-o", "json", "replay", log}, args...)...)
		var doc struct {
			Calls []struct {
				Index int64     `json:"index"`
				Time  time.Time `json:"time"`
			} `json:"calls"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
			t.Fatalf("replay %v: code %d\n%s\n%s", args, code, out, errs)
		}
		var idx []int64
		for _, c := range doc.Calls {
			idx = append(idx, c.Index)
		}
		return idx
	}
	out, _, _ := run("-o", "json", "replay", log)
	var all struct {
		Calls []struct {
			Index int64     `json:"index"`
			Time  time.Time `json:"time"`
		} `json:"calls"`
	}
	if err := json.Unmarshal([]byte(out), &all); err != nil || len(all.Calls) != 3 {
		t.Fatalf("timeline: %v\n%s", err, out)
	}
	// The calls' times are distinct instants; cut between the second and third.
	second, third := all.Calls[1], all.Calls[2]
	if !second.Time.Before(third.Time) {
		t.Fatalf("calls not in time order: %v %v", second.Time, third.Time)
	}
	cut := third.Time.Format(time.RFC3339Nano)
	if got := calls("--since", cut); len(got) != 1 || got[0] != third.Index {
		t.Fatalf("--since %s: %v, want [%d]", cut, got, third.Index)
	}
	if got := calls("--until", cut); len(got) != 2 || got[1] != second.Index {
		t.Fatalf("--until %s: %v, want the first two calls", cut, got)
	}
	if got := calls("--since", second.Time.Format(time.RFC3339Nano), "--until", cut); len(got) != 1 || got[0] != second.Index {
		t.Fatalf("--since/--until window: %v, want [%d]", got, second.Index)
	}
	if got := calls("--agent", "bob"); len(got) != 0 {
		t.Fatalf("--agent bob: %v, want none", got)
	}
	if got := calls("--agent", "alice", "--session", "s1", "--tool", "fs__read_file"); len(got) != 3 {
		t.Fatalf("--agent/--session/--tool: %v, want all three", got)
	}
	if got := calls("--tool", "fs__write_file"); len(got) != 0 {
		t.Fatalf("--tool fs__write_file: %v, want none", got)
	}
	for _, flag := range []string{"--since", "--until"} {
		_, errs, code := run("replay", log, flag, "yesterday")
		if code != exitcode.ExitUsage || !strings.Contains(errs, flag) || !strings.Contains(errs, "RFC 3339") {
			t.Fatalf("%s yesterday: code %d, %s", flag, code, errs)
		}
	}
}

// TestReplayCommandReportsAnInconsistentRecord: a denied call recorded as
// forwarded in enforcing mode is shown as inconsistent and exits 30, in the
// timeline (no bundle needed) and with --policy.
func TestReplayCommandReportsAnInconsistentRecord(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	log := replayLogWith(t, id, func(i int, rec *record.Call) bool {
		if i == 1 {
			rec.Outcome = record.OutcomeForwarded
		}
		return rec.Outcome == record.OutcomeForwarded
	})
	const why = "inconsistent: recorded deny in mode enforcing, yet forwarded"
	out, errs, code := run("replay", log)
	if code != exitcode.ExitReplay || !strings.Contains(out, "RECORD CHECK") || !strings.Contains(out, why) || !strings.Contains(out, "1 inconsistent call record(s)") || !strings.Contains(errs, "1 inconsistent call record(s)") {
		t.Fatalf("timeline: code %d\n%s\n%s", code, out, errs)
	}
	out, errs, code = run("replay", log, "--policy", "../../examples/policy/path-guard")
	if code != exitcode.ExitReplay || strings.Contains(out, "RECORD CHECK") || !strings.Contains(out, why) {
		t.Fatalf("--policy: code %d\n%s\n%s", code, out, errs)
	}
}

// TestReplayCommandShowsAMissingResult: a forwarded call without a result
// record reads forwarded/none, with a warning and a count, and exit 0.
func TestReplayCommandShowsAMissingResult(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	log := replayLogWith(t, id, func(i int, rec *record.Call) bool {
		return rec.Outcome == record.OutcomeForwarded && i != 0
	})
	out, errs, code := run("replay", log)
	if code != 0 || !strings.Contains(out, "forwarded/none") || !strings.Contains(out, "1 forwarded without a result record") || !strings.Contains(errs, "forwarded calls without a result record: 1") {
		t.Fatalf("code %d\n%s\n%s", code, out, errs)
	}
}

// TestReplayCommandMarksUnsignedCalls: a log whose seal and final
// checkpoint were cut (at a record boundary) replays with the
// verification's warnings on stderr, an UNSIGNED column and count, and every
// unsigned call listed even with --policy; exit 0, or 11 with
// --require-signed.
func TestReplayCommandMarksUnsignedCalls(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	idFile := filepath.Join(t.TempDir(), "auditor.key")
	if err := os.WriteFile(idFile, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const bundle = "../../examples/policy/path-guard"
	log := replayLog(t, id, -1)
	if _, errs, code := run("replay", log, "--require-signed"); code != 0 || strings.Contains(errs, "UNSIGNED") || !strings.Contains(errs, "verification: truncation of the tail cannot be detected") {
		t.Fatalf("sealed log: code %d\n%s", code, errs)
	}
	seg := filepath.Join(log, "epoch-000001", "seg-000001.jsonl")
	data, _ := os.ReadFile(seg)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	os.WriteFile(seg, []byte(strings.Join(lines[:len(lines)-2], "\n")+"\n"), 0o600) // seal, checkpoint

	out, errs, code := run("replay", log, "--policy", bundle, "--identity", idFile)
	if code != 0 || !strings.Contains(errs, "verification: unsealed tail") || !strings.Contains(errs, "UNSIGNED: 3 of the calls") ||
		!strings.Contains(out, "UNSIGNED") || strings.Count(out, "fs__read_file") != 3 || !strings.Contains(out, "3 same") || !strings.Contains(out, "3 in UNSIGNED records (no proof)") {
		t.Fatalf("cut log: code %d\n%s\n%s", code, out, errs)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "fs__read_file") && !strings.Contains(line, "UNSIGNED") {
			t.Fatalf("line not marked: %q", line)
		}
	}
	_, errs, code = run("replay", log, "--require-signed")
	if code != exitcode.ExitLogSig || !strings.Contains(errs, "3 of the calls are in records no checkpoint of their epoch's key signs") {
		t.Fatalf("--require-signed: code %d\n%s", code, errs)
	}
	out, _, code = run("-o", "json", "replay", log)
	var doc struct {
		Calls []struct {
			Unsigned bool `json:"unsigned"`
		} `json:"calls"`
		Sessions []struct {
			Unsigned bool `json:"unsigned"`
		} `json:"sessions"`
		Summary struct {
			Unsigned int `json:"unsigned"`
		} `json:"summary"`
		Warnings []string `json:"warnings"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || doc.Summary.Unsigned != 3 || !doc.Calls[0].Unsigned || !doc.Sessions[0].Unsigned || !strings.HasPrefix(doc.Warnings[0], "verification: ") {
		t.Fatalf("json: code %d\n%s", code, out)
	}
}

// TestReplayRefusesUnverifiedWithRequireSigned: --unverified replays a log
// that does not verify, so nothing in it is signed; with --require-signed
// the command is a contradiction and is refused as a usage error (exit 2)
// before the log is read. Before, it exited 0 on a log that did not verify.
func TestReplayRefusesUnverifiedWithRequireSigned(t *testing.T) {
	_, stderr, code := run("replay", t.TempDir(), "--unverified", "--require-signed")
	if code != 2 || !strings.Contains(stderr, "--unverified and --require-signed") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

// TestReplaySaysWhyCallsAreNotReplayable: in text output a call that could
// not be re-decided says why on its row, the summary says what to do, and an
// identity that opens no epoch's vault is a warning naming the error, once
// per epoch. Before, the rows read only "not-replayable", and the reason
// (and the hint to pass --identity) was only in -o json.
func TestReplaySaysWhyCallsAreNotReplayable(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	other, _ := age.GenerateX25519Identity()
	otherFile := filepath.Join(t.TempDir(), "other.key")
	if err := os.WriteFile(otherFile, []byte(other.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const bundle = "../../examples/policy/path-guard"
	log := replayLog(t, id, -1)

	out, errs, code := run("replay", log, "--policy", bundle, "--all")
	if code != 0 || strings.Count(out, "not-replayable: its decision reads the arguments") != 3 ||
		!strings.Contains(out, "3 not replayable: its decision reads the arguments: pass --identity with an age identity the log's payloads are encrypted to") {
		t.Fatalf("without identity: code %d\n%s\n%s", code, out, errs)
	}
	out, errs, code = run("replay", log, "--policy", bundle, "--all", "--identity", otherFile)
	if code != 0 || strings.Count(errs, "payload vault cannot be opened") != 1 ||
		!strings.Contains(errs, "epoch 1: the payload vault cannot be opened with the --identity given: open the commitment secret of epoch 1: identity did not match any of the recipients") ||
		strings.Count(out, "not-replayable: its decision reads the arguments, and epoch 1's payload vault cannot be opened") != 3 ||
		!strings.Contains(out, "3 not replayable: its decision reads the arguments, and epoch 1's payload vault cannot be opened") {
		t.Fatalf("other identity: code %d\n%s\n%s", code, out, errs)
	}
}

// TestReplaySummarisesCallsNotChecked: with --policy, calls that could not
// be checked for one cause are one line (their count, the cause, the first
// records) instead of a row each; --all lists them. Before, every
// argument-dependent call of a log replayed without --identity was a row.
func TestReplaySummarisesCallsNotChecked(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	log := replayLog(t, id, -1)
	out, errs, code := run("replay", log, "--policy", "../../examples/policy/path-guard")
	if code != 0 || strings.Contains(out, "│") || strings.Contains(out, "fs__read_file") ||
		!regexp.MustCompile(`(?m)^3 not replayable: its decision reads the arguments: pass --identity .*\(records 1:\d+, 1:\d+, 1:\d+; --all lists them\)$`).MatchString(out) {
		t.Fatalf("code %d\n%s\n%s", code, out, errs)
	}
	out, errs, code = run("replay", log, "--policy", "../../examples/policy/path-guard", "--all")
	if code != 0 || strings.Count(out, "fs__read_file") != 3 || strings.Contains(out, "--all lists them") {
		t.Fatalf("--all: code %d\n%s\n%s", code, out, errs)
	}
}

// TestReplayEscapesAgentText: text an agent chose (its clientInfo.name, a
// session's agent and tool as the log holds them) reaches the replay
// tables as one line with its tabs and line breaks as spaces and every
// other control character shown escaped, even with --color always on a
// terminal: an ESC[31m in a client name is printed as the text \x1b[31m,
// not sent to the auditor's terminal, and the columns stay aligned.
func TestReplayEscapesAgentText(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := t.TempDir()
	w, err := auditlog.Open(dir, auditlog.Options{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const evil = "tab\there \x1b[31mred\rcr\u0085nel\u2028ls\x1b]0;title\x07"
	w.Append(ctx, &record.Session{ID: "s1", Event: "start", Agent: "al\x1b[8mice", Front: "http", ClientName: evil})
	w.Append(ctx, &record.Call{Session: "s1", Agent: "al\x1b[8mice", Tool: "fs__read\tfile", Upstream: "fs", Outcome: record.OutcomeRefused, Reason: "unknown tool"})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, errs, code := run("replay", dir, "--color", "always")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{`tab here \x1b[31mred cr nel ls\x1b]0;title\x07`, `al\x1b[8mice`, "fs__read file"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%q", want, out)
		}
	}
	sgr := regexp.MustCompile(`\x1b\[[0-9;:]*m`)
	var width int
	for _, l := range strings.Split(out, "\n") {
		plain := sgr.ReplaceAllString(l, "")
		if strings.ContainsFunc(plain, func(r rune) bool { return r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == 0x2028 }) {
			t.Errorf("line %q holds a control character", l)
		}
		if strings.HasPrefix(plain, "┌") {
			width = utf8.RuneCountInString(plain)
		}
		if strings.HasPrefix(plain, "│") && utf8.RuneCountInString(plain) != width {
			t.Errorf("line %q is not as wide as its table (%d)", plain, width)
		}
	}
}

// TestReplayOfARecordOfAnotherFormIsALogError: a record whose member
// has another JSON type than the gateway writes (a policy_mode that is an
// array) stops replay with an audit-log integrity exit status (10) and a
// message naming the record and member, not "unexpected internal failure" (1).
func TestReplayOfARecordOfAnotherFormIsALogError(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log")
	if err := os.CopyFS(dir, os.DirFS("../../testdata/auditlog/log")); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	b, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte(`"policy_mode":"enforcing"`), []byte(`"policy_mode":[1]`), 1)
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "replay", dir, "--unverified")
	if code != exitcode.ExitLogInteg || !strings.Contains(errOut, "cannot be read") || !strings.Contains(errOut, "policy_mode") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
}

// writeSizes records the size of every Write (only Write: no ReadFrom).
type writeSizes struct {
	buf   bytes.Buffer
	sizes []int
}

func (w *writeSizes) Write(b []byte) (int, error) {
	w.sizes = append(w.sizes, len(b))
	return w.buf.Write(b)
}

// TestReplayStreamsItsTables: cmcp replay writes its session and call
// tables as they are made, never rendered whole in memory: a timeline of
// 2,000 sessions and 2,000 calls (about half a megabyte of table) reaches
// stdout in many writes, none holding much more than TableRows' 64 KiB
// batch, with every row there. (The tables once went through lipgloss
// whole: a million calls took minutes and gigabytes.)
func TestReplayStreamsItsTables(t *testing.T) {
	const n = 2000
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := t.TempDir()
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, CheckpointEvery: 1000, Durability: record.DurabilityInterval})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range n {
		sess := fmt.Sprintf("session-%05d", i)
		if _, err := w.Append(ctx, &record.Session{ID: sess, Event: "start", Agent: "alice", Front: "http"}); err != nil {
			t.Fatal(err)
		}
		rc, err := w.Append(ctx, &record.Call{Session: sess, Agent: "alice", Tool: "fs__read_file", Upstream: "fs", UpstreamTool: "read_file",
			EvidenceClass: "spawn-measured", Args: w.Commit([]byte(fmt.Sprintf(`{"path":"/srv/data/%d"}`, i))), Decision: "allow",
			PolicyIDs: []string{"allow-data"}, PolicyMode: "enforcing", Outcome: record.OutcomeForwarded})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(ctx, &record.Result{Call: rc.Index, Session: sess, Outcome: record.ResultOK, LatencyMicros: 1500}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var out writeSizes
	var errb bytes.Buffer
	if code := Main([]string{"replay", dir}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("replay: exit %d\n%s", code, errb.String())
	}
	if got := strings.Count(out.buf.String(), "session-"); got != 2*n {
		t.Fatalf("%d rows name a session, want %d (both tables)", got, 2*n)
	}
	const batch = 64<<10 + 1024 // TableRows' batch and the line that passes it
	largest, big := 0, 0
	for _, s := range out.sizes {
		largest = max(largest, s)
		if s >= 32<<10 {
			big++
		}
	}
	if out.buf.Len() < 8*batch || largest > batch || big < 6 {
		t.Fatalf("%d bytes of tables in %d writes (the largest %d bytes, %d of 32 KiB or more): want them written in batches of at most %d bytes as the rows are made", out.buf.Len(), len(out.sizes), largest, big, batch)
	}
}
