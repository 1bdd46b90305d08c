package cli

import (
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"filippo.io/age"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/replay"
	"github.com/confidential-mcp/cmcp/internal/ui"
)

type replayOptions struct {
	keys        []string
	checkpoints []string
	policies    []string
	whatIf      string
	identities  []string
	unverified  bool
	requireSign bool
	all         bool
	session     string
	agent       string
	tool        string
	decision    string
	since       string
	until       string
}

func (o *replayOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.policies, "policy", nil, "re-evaluate every call against this bundle `DIR` (its digest must be the one the log recorded; repeat for logs that switched bundles)")
	fs.StringVar(&o.whatIf, "what-if", "", "evaluate every call against this bundle `DIR` and list the calls whose decision would change")
	fs.StringArrayVar(&o.identities, "identity", nil, "age identity `FILE` of an auditor: opens the sealed payload vault so that argument-dependent decisions can be replayed")
	fs.StringArrayVar(&o.keys, "key", nil, "trusted note verifier key (origin+hash+base64), or a file with one per line, as for verify-chain; repeatable")
	fs.StringArrayVar(&o.checkpoints, "checkpoint", nil, "signed checkpoint `FILE` saved earlier, as for verify-chain; repeatable")
	fs.BoolVar(&o.unverified, "unverified", false, "replay even if the log does not verify; every output line is then marked UNVERIFIED (refused with --require-signed)")
	fs.BoolVar(&o.requireSign, "require-signed", false, "fail (exit 11) where verify-chain --require-signed does (an earlier epoch's records its key never signed), and also when a reported call's record or its result comes after its epoch's last checkpoint (the newest epoch's unsealed tail included): its replay proves nothing")
	fs.BoolVar(&o.all, "all", false, "with --policy or --what-if, list every call, not only those with a finding or an unsigned record (calls that could not be checked are otherwise counted by cause, with their first records)")
	fs.StringVar(&o.session, "session", "", "only calls of this session `ID`")
	fs.StringVar(&o.agent, "agent", "", "only calls of this agent `IDENTITY`")
	fs.StringVar(&o.tool, "tool", "", "only calls of this exposed tool `NAME`")
	fs.StringVar(&o.decision, "decision", "", "only calls with this recorded decision (allow or deny)")
	fs.StringVar(&o.since, "since", "", "only calls at or after this `TIME` (RFC 3339)")
	fs.StringVar(&o.until, "until", "", "only calls before this `TIME` (RFC 3339)")
}

func (o *replayOptions) options() (replay.Options, error) {
	opts := replay.Options{Policies: o.policies, WhatIf: o.whatIf, Unverified: o.unverified,
		Filter: replay.Filter{Session: o.session, Agent: o.agent, Tool: o.tool, Decision: o.decision}}
	if o.unverified && o.requireSign {
		return opts, exitcode.Errorf(exitcode.ExitUsage, "--unverified and --require-signed contradict each other: a log replayed unverified proves nothing signed").
			Hint("drop --unverified to fail (exit 11) where the log's records are not signed, or --require-signed to look at a log that does not verify")
	}
	switch o.decision {
	case "", "allow", "deny":
	default:
		return opts, exitcode.Errorf(exitcode.ExitUsage, "--decision %q: want allow or deny", o.decision)
	}
	for _, t := range []struct {
		flag, v string
		dst     *time.Time
	}{{"--since", o.since, &opts.Filter.Since}, {"--until", o.until, &opts.Filter.Until}} {
		if t.v == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339Nano, t.v)
		if err != nil {
			return opts, exitcode.Errorf(exitcode.ExitUsage, "%s %q: want an RFC 3339 time such as 2026-11-30T01:00:00Z", t.flag, t.v)
		}
		*t.dst = v
	}
	vo := verifyChainOptions{Keys: o.keys}
	keys, err := vo.loadKeys()
	if err != nil {
		return opts, err
	}
	opts.Verify.Keys = keys
	opts.Verify.RequireSigned = o.requireSign // as verify-chain --require-signed, before the calls' own check
	for _, f := range o.checkpoints {
		b, err := readInput(f)
		if err != nil {
			return opts, exitcode.Errorf(exitcode.ExitIO, "--checkpoint: %w", err)
		}
		opts.Verify.Checkpoints = append(opts.Verify.Checkpoints, b)
	}
	for _, path := range o.identities {
		f, err := os.Open(path)
		if err != nil {
			return opts, exitcode.Errorf(exitcode.ExitIO, "--identity: %w", err)
		}
		ids, err := age.ParseIdentities(f)
		f.Close()
		if err != nil {
			return opts, exitcode.Errorf(exitcode.ExitUsage, "--identity %s: %w", path, err).Hint("the file must hold age identities (AGE-SECRET-KEY-1...), as written by age-keygen")
		}
		opts.Identities = append(opts.Identities, ids...)
	}
	return opts, nil
}

type replayDoc struct {
	SchemaVersion int `json:"schema_version"`
	*replay.Report
}

func newReplayCmd(e *env) *cobra.Command {
	o := &replayOptions{}
	cmd := &cobra.Command{
		Use:   "replay LOGDIR...",
		Short: "Rebuild sessions and calls from an audit log and re-check every policy decision",
		Long:  replayLong,
		Example: `  cmcp replay /var/lib/cmcp/audit
  cmcp replay /var/lib/cmcp/audit --policy policy/ --identity auditor.key
  cmcp replay /var/lib/cmcp/audit --what-if policy-next/ --agent alice`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runReplay(cmd, e, o, args)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// replayLong is replay's help text.
const replayLong = `replay verifies an audit log (as verify-chain does), then prints its
timeline: sessions, agents, calls, upstreams and their evidence classes,
decisions, latencies and outcomes. Reads of resources and prompts
(resources/read, resources/subscribe, prompts/get, completion/complete) are
listed with the calls under their method, counted apart, and checked the
same way.

With --policy DIR it re-evaluates every recorded call against the bundle the
log recorded (a bundle with another digest is refused) and reports every call
whose recorded decision differs: proof that no decision was flipped. With
--what-if DIR it evaluates every call against another bundle and lists the
calls whose decision would change.

A decision that depends on the call's arguments (or a read's URI) needs them: with --identity
(an auditor's age identity) replay opens the sealed payload vault, checks each
payload against its commitment in the log (a mismatch is tampering), and uses
it. Without it those calls are not replayable, never guessed: they are
counted by cause, with what to do (--all lists them). Under
a bundle that checks the argument types its schema declares (one whose
policies read context.arguments), every call's decision depends on its
arguments, whatever the tool: a declared argument sent with another type is
denied.

What the verification could not establish is repeated as a warning
("verification: ..."): a tail no signature covers, a torn last line, that
truncation cannot be detected without --checkpoint. A call whose record comes
after its epoch's last checkpoint is marked UNSIGNED: anyone able to write the
log could have written it, so its replay proves nothing. That is the normal
state of a running gateway's newest records, so it is a warning (exit 0)
unless --require-signed.

A call record that contradicts itself or the policy its epoch recorded is
reported as inconsistent, with or without --policy: a deny forwarded in
enforcing mode, a mode or bundle that no genesis or policy record of its
epoch put in force, a call forwarded without a policy decision in an epoch
that runs a policy.

Several LOGDIRs (the gateways of a fleet, each with its own log) are
verified and replayed each, then shown as one timeline: every session and
call names its gateway's log, calls in time order.

Exit status 30 when a decision differs, a payload was tampered with, a
record names a bundle without the decision's input, or a call record is
inconsistent.`

// runReplay verifies and replays the logs in args and prints the timeline.
func runReplay(cmd *cobra.Command, e *env, o *replayOptions, args []string) error {
	opts, err := o.options()
	if err != nil {
		return err
	}
	// A batch over up to millions of records: trade memory for
	// fewer garbage collections (measured: BenchmarkReplay100k).
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	p := e.printer()
	prog := p.Progress("reading records", 0)
	opts.Progress = func(n int64) { prog.Add(4096) }
	var reps []*replay.Report
	for _, dir := range args {
		r, err := replay.Run(cmd.Context(), dir, opts)
		if err != nil {
			prog.Done()
			return err
		}
		reps = append(reps, r)
	}
	prog.Done()
	rep := reps[0]
	if len(reps) > 1 {
		// A fleet: one timeline of every gateway's log.
		rep = replay.Merge(reps)
	}
	if rep.Unverified != "" {
		p.Warnf("UNVERIFIED: the log does not verify (%s); every line below is marked", rep.Unverified)
	}
	for _, w := range rep.Warnings {
		p.Warnf("%s", w)
	}
	if p.JSONOut {
		if err := p.JSON(replayDoc{SchemaVersion: ui.SchemaVersion, Report: rep}); err != nil {
			return err
		}
	} else {
		printReplay(p, rep, o)
	}
	s := rep.Summary
	if rep.Findings() {
		return exitcode.Errorf(exitcode.ExitReplay, "replay found %d decision(s) that differ from the record, %d tampered payload(s), %d incomplete record(s), %d inconsistent call record(s)", s.Differs, s.Tampered, s.Incomplete, s.Inconsistent)
	}
	if o.requireSign && s.Unsigned > 0 {
		return exitcode.Errorf(exitcode.ExitLogSig, "%d of the calls are in records no checkpoint of their epoch's key signs (--require-signed)", s.Unsigned).
			Hint("the newest epoch's tail is signed at its next checkpoint (or at shutdown); a crashed epoch's tail never is: whether to trust it depends on who could write the audit disk while the gateway was down")
	}
	return nil
}

// replayTables prints the tables of a replay. Every row of an unverified
// log is marked; otherwise, if some records are unsigned, a column marks
// theirs.
type replayTables struct {
	p   *ui.Printer
	rep *replay.Report
	o   *replayOptions
	// unsigned: the log verified and some of its records are unsigned.
	unsigned bool
	// consistency: a column of its own says a call record is
	// inconsistent. With --policy the REPLAY column says it; without it a
	// column does, when there is one.
	consistency bool
}

func printReplay(p *ui.Printer, rep *replay.Report, o *replayOptions) {
	t := &replayTables{p: p, rep: rep, o: o,
		unsigned:    rep.Unverified == "" && (rep.Summary.Unsigned > 0 || slices.ContainsFunc(rep.Sessions, func(s *replay.Session) bool { return s.Unsigned })),
		consistency: len(o.policies) == 0 && rep.Summary.Inconsistent > 0}
	checking := len(o.policies) > 0 || o.whatIf != ""
	// The tables are streamed (TableRows): a log may hold millions of calls.
	if !checking {
		t.sessions()
	}
	t.calls(checking)
	printNotChecked(p, rep.Calls, o.all)
	p.Printf("%s\n", rep.SummaryLine(len(o.policies) > 0, o.whatIf != ""))
}

// mark marks a row of an unverified log, or of an unsigned record (u).
func (t *replayTables) mark(row []string, u bool) []string {
	switch {
	case t.rep.Unverified != "":
		return append([]string{"UNVERIFIED"}, row...)
	case t.unsigned && u:
		return append([]string{t.p.Warn("UNSIGNED")}, row...)
	case t.unsigned:
		return append([]string{""}, row...)
	}
	return row
}

// head is the header of a table whose rows mark marks.
func (t *replayTables) head(h ...string) []string {
	switch {
	case t.rep.Unverified != "":
		return append([]string{"UNVERIFIED"}, h...)
	case t.unsigned:
		return append([]string{"UNSIGNED"}, h...)
	}
	return h
}

// sessions prints the table of sessions, if there is one.
func (t *replayTables) sessions() {
	rep := t.rep
	if len(rep.Sessions) == 0 {
		return
	}
	fleet := rep.Sessions[0].Gateway != ""
	h := []string{"SESSION", "AGENT", "FRONT", "CLIENT", "START", "END", "CALLS"}
	if fleet {
		h = append([]string{"GATEWAY"}, h...)
	}
	t.p.TableRows(t.head(h...), len(rep.Sessions), func(i int) []string {
		s := rep.Sessions[i]
		row := []string{ui.Clean(s.ID), ui.Clean(s.Agent), ui.Clean(s.Front), ui.Clean(s.Client), stamp(s.Start), stamp(s.End), fmt.Sprint(s.Calls)}
		if fleet {
			row = append([]string{ui.Clean(s.Gateway)}, row...)
		}
		return t.mark(row, s.Unsigned)
	})
}

// calls prints the table of calls: all of them, or when checking (and not
// --all) those with a finding or an unsigned record.
func (t *replayTables) calls(checking bool) {
	listed := t.rep.Calls
	if checking && !t.o.all {
		listed = nil
		for _, c := range t.rep.Calls {
			if c.Finding() || c.Unsigned {
				listed = append(listed, c)
			}
		}
	}
	h := []string{"RECORD", "TIME", "SESSION", "AGENT", "TOOL", "CLASS", "DECISION", "POLICIES", "MODE", "OUTCOME", "LATENCY"}
	if len(t.o.policies) > 0 {
		h = append(h, "REPLAY")
	}
	if t.o.whatIf != "" {
		h = append(h, "WHAT-IF")
	}
	if t.consistency {
		h = append(h, "RECORD CHECK")
	}
	if len(listed) > 0 {
		t.p.TableRows(t.head(h...), len(listed), func(i int) []string { return t.callRow(listed[i]) })
	}
}

// callRow is the row of a call in the table of calls.
func (t *replayTables) callRow(c *replay.Call) []string {
	p, o := t.p, t.o
	outcome := c.Outcome
	if c.Result != "" {
		outcome += "/" + c.Result
	}
	latency := ""
	if c.LatencyMicros > 0 {
		latency = (time.Duration(c.LatencyMicros) * time.Microsecond).String()
	}
	tool := c.Tool
	if c.Action != "" {
		// An access: its method, and the prompt's name (a URI is
		// only committed to).
		tool = strings.TrimSpace(c.Method + " " + c.Prompt)
	}
	// Every text from the log goes through ui.Clean, before it is
	// styled: an agent or a forged record chooses it.
	at := fmt.Sprintf("%d:%d", c.Epoch, c.Index)
	if c.Gateway != "" {
		at = ui.Clean(c.Gateway) + " " + at // a fleet: the gateway's log
	}
	row := []string{at, stamp(c.Time), ui.Clean(c.Session), ui.Clean(c.Agent), ui.Clean(tool), ui.Clean(c.EvidenceClass),
		decisionWord(p, c.Decision), ui.Clean(strings.Join(c.PolicyIDs, ",")), ui.Clean(c.Mode), ui.Clean(outcome), latency}
	if len(o.policies) > 0 {
		row = append(row, checkWord(p, c.Replay))
	}
	if o.whatIf != "" {
		row = append(row, checkWord(p, c.WhatIf))
	}
	if t.consistency {
		row = append(row, "")
		if c.Inconsistent != "" {
			row[len(row)-1] = p.Bad(ui.Clean(replay.StatusInconsistent + ": " + c.Inconsistent))
		}
	}
	return t.mark(row, c.Unsigned)
}

// printNotChecked prints the calls that could not be checked, a line per
// cause (with their first records unless all lists them).
func printNotChecked(p *ui.Printer, calls []*replay.Call, all bool) {
	for _, g := range replay.NotChecked(calls) {
		if all {
			p.Printf("%d %s: %s\n", g.N, g.Label, g.Why)
			continue
		}
		more := ""
		if g.N > len(g.First) {
			more = ", ..."
		}
		p.Printf("%d %s: %s (records %s%s; --all lists them)\n", g.N, g.Label, g.Why, strings.Join(g.First, ", "), more)
	}
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func decisionWord(p *ui.Printer, d string) string {
	if d == "allow" {
		return p.OK(d)
	}
	return p.Bad(ui.Clean(d))
}

func checkWord(p *ui.Printer, ck *replay.Check) string {
	if ck == nil {
		return ""
	}
	// Reasons quote the log (modes, tools, policy ids): cleaned as the
	// other cells are.
	switch ck.Status {
	case replay.StatusSame, replay.StatusUnchanged:
		return p.OK(ck.Status)
	case replay.StatusDiffers, replay.StatusTampered, replay.StatusIncomplete, replay.StatusInconsistent:
		return p.Bad(ui.Clean(ck.Status + ": " + ck.Reason))
	case replay.StatusChanges:
		return p.Warn(ui.Clean(ck.Status + " to " + ck.Decision + " (" + strings.Join(ck.PolicyIDs, ",") + ")"))
	}
	if ck.Why != "" {
		return p.Warn(ui.Clean(ck.Status + ": " + ck.Why))
	}
	return p.Warn(ui.Clean(ck.Status))
}
