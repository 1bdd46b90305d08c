// Package replay rebuilds sessions and calls from an audit log and
// re-evaluates every recorded policy decision: against the bundle the log
// recorded (proof that no decision was flipped) or against another bundle
// (what would change). It is the library behind `cmcp replay`.
package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Options are the options of Run.
type Options struct {
	// Policies are bundle directories to replay against. Each must have a
	// digest the log recorded; every call is checked against the bundle whose
	// digest its record names.
	Policies []string
	// WhatIf is a bundle directory to evaluate every call against, listing
	// the calls whose decision would change.
	WhatIf string
	// Identities open the sealed payload vault (age identities of an
	// auditor). Without them, calls whose decision depends on the arguments
	// are reported as not replayable.
	Identities []age.Identity
	// Unverified replays a log that does not verify; every output line is
	// then marked.
	Unverified bool
	// Verify holds the trusted keys and saved checkpoints the log is
	// verified against before it is replayed (as verify-chain does).
	Verify auditlog.VerifyOptions
	// Filter selects the calls reported.
	Filter Filter
	// Progress, if set, is called with the number of records read so far.
	Progress func(records int64)
}

// Filter selects calls. Empty fields select everything.
type Filter struct {
	Session  string
	Agent    string
	Tool     string
	Decision string // allow or deny
	Since    time.Time
	Until    time.Time
}

func (f *Filter) match(c *Call) bool {
	return (f.Session == "" || c.Session == f.Session) &&
		(f.Agent == "" || c.Agent == f.Agent) &&
		(f.Tool == "" || c.Tool == f.Tool) &&
		(f.Decision == "" || c.Decision == f.Decision) &&
		(f.Since.IsZero() || !c.Time.Before(f.Since)) &&
		(f.Until.IsZero() || c.Time.Before(f.Until))
}

// Check statuses.
const (
	StatusSame          = "same"           // replay gives the recorded decision
	StatusDiffers       = "differs"        // replay gives another decision, or other determining policies
	StatusNotReplayable = "not-replayable" // the decision depends on arguments that are not available
	StatusTampered      = "tampered"       // the vault's payload does not match the commitment in the log
	StatusNoBundle      = "no-bundle"      // the bundle the record names was not given
	StatusNoDecision    = "no-decision"    // no policy decided this call (mode none, or refused before the decision)
	StatusIncomplete    = "incomplete"     // the record names a bundle but not the decision's input
	StatusInconsistent  = "inconsistent"   // the record contradicts itself or the policy its epoch recorded (Call.Inconsistent says how)
	StatusUnchanged     = "unchanged"      // what-if: same allow/deny
	StatusChanges       = "changes"        // what-if: the decision would change
)

// Check is the outcome of re-evaluating one call.
type Check struct {
	Status    string   `json:"status"`
	Decision  string   `json:"decision,omitempty"`
	PolicyIDs []string `json:"policy_ids,omitempty"`
	Reason    string   `json:"reason,omitempty"`
	// Why says, for a call that could not be checked (not replayable, no
	// bundle), why in one short line without the call's particulars, and
	// what to do when there is something: the same for every call with that
	// cause, so that calls can be grouped by it. Reason says it in full.
	Why string `json:"-"`
}

// Causes of calls that could not be checked (Check.Why).
const (
	whyNoIdentity = "pass --identity with an age identity the log's payloads are encrypted to"
	whyBlocked    = "the what-if bundle reads context.session.tools_used, and an earlier call of its session has no known what-if outcome"
)

// Call is one tools/call of the timeline, or one access: a request that
// read an upstream's resources or prompts (resources/read,
// resources/subscribe, prompts/get, completion/complete), recorded in an
// access record and decided as action read_resource or get_prompt. An
// access has Action and Method set, no Tool and never a result record.
type Call struct {
	Gateway string    `json:"gateway,omitempty"` // the audit directory, in a fleet (Merge)
	Epoch   int       `json:"epoch"`
	Index   int64     `json:"index"`
	Time    time.Time `json:"time"`
	Session string    `json:"session"`
	Agent   string    `json:"agent"`
	Tool    string    `json:"tool"`
	// Action is read_resource or get_prompt for an access (empty for a
	// tools/call); Method its MCP method; Prompt the prompt's name at its
	// upstream (get_prompt). A read's URI is in the log only as a
	// commitment.
	Action        string   `json:"action,omitempty"`
	Method        string   `json:"method,omitempty"`
	Prompt        string   `json:"prompt,omitempty"`
	Upstream      string   `json:"upstream,omitempty"`
	EvidenceClass string   `json:"evidence_class,omitempty"`
	Decision      string   `json:"decision"`
	PolicyIDs     []string `json:"policy_ids,omitempty"`
	Mode          string   `json:"mode"`
	Bundle        string   `json:"bundle,omitempty"`
	Outcome       string   `json:"outcome"`
	Reason        string   `json:"reason,omitempty"`
	Result        string   `json:"result,omitempty"` // outcome of the result record; ResultNone for a forwarded call without one
	LatencyMicros int64    `json:"latency_us,omitempty"`
	Replay        *Check   `json:"replay,omitempty"`
	WhatIf        *Check   `json:"what_if,omitempty"`
	Unverified    bool     `json:"unverified,omitempty"`
	// Unsigned: the record comes after its epoch's last checkpoint, so no
	// signature of the epoch's key covers it (the unsealed tail of the
	// newest epoch, or the tail a crashed gateway left): anyone able to
	// write the log could have written it, and its replay proves nothing.
	Unsigned bool `json:"unsigned,omitempty"`
	// Inconsistent says how the record contradicts itself or the policy its
	// epoch recorded (see inconsistency); it is found with or without
	// --policy, and is a finding.
	Inconsistent string `json:"inconsistent,omitempty"`

	rec      *record.Call   // for an access: its decision's fields, Args the URI's commitment
	acc      *record.Access // the access record, or nil
	ep       *epochState
	npol     int    // len(ep.policies) when the record was read
	resultAt int64  // index of the result record, if any
	contra   string // how the record contradicts its epoch as read so far: a commitment number reused (epochState.commit), a forward while killed
}

// ResultNone is the Result of a forwarded call that has no result record.
const ResultNone = "none"

// Session is one agent session of the timeline.
type Session struct {
	Gateway    string    `json:"gateway,omitempty"` // the audit directory, in a fleet (Merge)
	Epoch      int       `json:"epoch"`
	ID         string    `json:"id"`
	Agent      string    `json:"agent"`
	Front      string    `json:"front,omitempty"`
	Client     string    `json:"client,omitempty"`
	Start      time.Time `json:"start,omitzero"`
	End        time.Time `json:"end,omitzero"`
	Calls      int       `json:"calls"`
	Unverified bool      `json:"unverified,omitempty"`
	Unsigned   bool      `json:"unsigned,omitempty"` // a session record comes after its epoch's last checkpoint

	last int64 // index of its last session record
}

// Summary counts the calls and accesses reported and the outcomes of the
// checks (of both).
type Summary struct {
	Records       int64 `json:"records"`
	Calls         int   `json:"calls"`
	Accesses      int   `json:"accesses,omitempty"` // access records (resources/read, prompts/get, ...) listed among Calls
	Same          int   `json:"same,omitempty"`
	Differs       int   `json:"differs,omitempty"`
	NotReplayable int   `json:"not_replayable,omitempty"`
	Tampered      int   `json:"tampered,omitempty"`
	NoBundle      int   `json:"no_bundle,omitempty"`
	NoDecision    int   `json:"no_decision,omitempty"`
	Incomplete    int   `json:"incomplete,omitempty"`
	// Inconsistent counts the calls whose record is inconsistent, with or
	// without --policy; with it their replay status is inconsistent unless
	// the replay found worse (differs, tampered, incomplete).
	Inconsistent int `json:"inconsistent,omitempty"`
	// NoResult counts the forwarded calls without a result record.
	NoResult int `json:"no_result,omitempty"`
	// Unsigned counts the calls whose record no signature covers
	// (Call.Unsigned), whatever their check says.
	Unsigned int `json:"unsigned,omitempty"`
	Changes  int `json:"what_if_changes,omitempty"`
	// WhatIfNotEvaluated counts the calls whose what-if decision could not
	// be evaluated (not replayable, no decision, incomplete), apart from
	// replay's counts above.
	WhatIfNotEvaluated int `json:"what_if_not_evaluated,omitempty"`
}

// Report is the result of Run.
type Report struct {
	Log string `json:"log"`
	// Unverified is set (to the verification failure) when the log did not
	// verify and Options.Unverified replayed it anyway.
	Unverified string            `json:"unverified,omitempty"`
	Bundles    map[string]string `json:"bundles,omitempty"` // digest -> directory replayed against
	WhatIf     string            `json:"what_if_bundle,omitempty"`
	Sessions   []*Session        `json:"sessions"`
	Calls      []*Call           `json:"calls"`
	Summary    Summary           `json:"summary"`
	// Warnings are inconsistencies that are not proof of tampering (a crash
	// can cause them too), after the warnings of the log's verification
	// (each starting with VerifyWarning): what it could not establish.
	Warnings []string `json:"warnings,omitempty"`
}

// VerifyWarning starts each warning of Report.Warnings that comes from the
// verification of the log (what verify-chain would warn of).
const VerifyWarning = "verification: "

// Findings reports whether replay found a flipped decision, a tampered
// payload, an incomplete record or a call record that contradicts itself or
// its epoch's policy.
func (r *Report) Findings() bool {
	return r.Summary.Differs > 0 || r.Summary.Tampered > 0 || r.Summary.Incomplete > 0 || r.Summary.Inconsistent > 0
}

// epochState is what replay keeps about the epoch being read.
type epochState struct {
	epoch   int
	dir     string
	genesis *record.Genesis
	opener  *auditlog.Opener
	openErr error
	// notOpen holds the check of a call whose decision reads the arguments
	// (or URI) while the vault is not open, by what it reads.
	notOpenMu sync.Mutex
	notOpen   map[string]*Check
	calls     map[int64]*Call // reported calls by record index, until their result
	// isCall and answered are sets of record indices: every call record of
	// the epoch (reported or not), and those a result record answered.
	isCall, answered bitset
	// policies are the bundles and modes the epoch's genesis and its policy
	// records (loaded, reloaded) put in force, in log order.
	policies []policyState
	// commits is the set of commitment numbers the epoch's call, access
	// and result records used (numbers past maxDenseCommit in far).
	commits bitset
	far     map[int64]bool
	// killedAt is 1 + the index of the kill_switch_on record that engaged
	// the kill switch, 0 while it is clear. Each epoch starts clear: a
	// gateway that restarts with the switch engaged records a new
	// kill_switch_on in its new epoch before it serves (killswitch.Switch.Restore).
	killedAt int64
	// machines are the tunnel machines a machine record registered in
	// the epoch (upstream "\x00" machine id); machineRecords: the epoch
	// holds machine records (its gateway records registrations).
	machines       map[string]bool
	machineRecords bool
}

// killed returns how a record forwarded now contradicts the kill switch,
// or "": the gateway writes no forwarded call or access record between
// kill_switch_on and kill_switch_off (Gateway.SetKillSwitch: both check the
// switch and append under the lock the switch changes under).
func (ep *epochState) killed(outcome string) string {
	if ep.killedAt == 0 || outcome != record.OutcomeForwarded {
		return ""
	}
	return fmt.Sprintf("forwarded while the kill switch was engaged (kill_switch_on, record %d): the gateway forwards nothing from kill_switch_on until kill_switch_off", ep.killedAt-1)
}

// maxDenseCommit bounds the commitment numbers kept in a bitset (4 MiB):
// the writer numbers commitments 0, 1, 2, ..., so a larger one is rare.
const maxDenseCommit = 1 << 25

// commit records that a record used commitment c and reports whether an
// earlier record of the epoch used its number: the writer numbers every
// commitment anew (Writer.Commit), so a number used twice is a record
// that borrowed another's payload.
func (ep *epochState) commit(c record.Commitment) bool {
	if c.IsZero() {
		return false
	}
	if c.ID >= 0 && c.ID < maxDenseCommit {
		if ep.commits.has(c.ID) {
			return true
		}
		ep.commits.set(c.ID)
		return false
	}
	if ep.far[c.ID] {
		return true
	}
	if ep.far == nil {
		ep.far = map[int64]bool{}
	}
	ep.far[c.ID] = true
	return false
}

// reusedMsg says how a record reuses a commitment number.
func reusedMsg(what string, c record.Commitment) string {
	return fmt.Sprintf("%s commitment %d, which an earlier record of the epoch already used: the gateway commits to every payload under a new number, so the record borrowed another's payload", what, c.ID)
}

// bitset is a set of record indices.
type bitset []uint64

func (b *bitset) set(i int64) {
	for int64(len(*b)) <= i/64 {
		*b = append(*b, 0)
	}
	(*b)[i/64] |= 1 << (i % 64)
}

func (b bitset) has(i int64) bool {
	return i >= 0 && i/64 < int64(len(b)) && b[i/64]&(1<<(i%64)) != 0
}

type policyState struct {
	bundle digest.Digest
	mode   string
	at     int64 // record index of the genesis or policy record
}

// Run reads the log in dir, verifying it first, and replays it.
func Run(ctx context.Context, dir string, opts Options) (*Report, error) {
	rep := &Report{Log: dir, Bundles: map[string]string{}}
	bundles, whatIf, err := loadBundles(ctx, &opts, rep)
	if err != nil {
		return nil, err
	}
	// A what-if bundle that reads tools_used is simulated over every
	// decided call of a session, those a filter leaves out of the report
	// too (readState.hidden).
	simulate := whatIf != nil && whatIf.ReadsToolsUsed()
	st, vrep, err := readLog(ctx, dir, &opts, rep, simulate)
	if err != nil {
		return nil, err
	}
	rep = st.rep
	verified := verification(rep, vrep)
	used := st.sessionUses()
	st.warnStrays()
	st.warnUnregistered()
	checkRecords(rep, used)
	slices.Sort(rep.Warnings)
	rep.Warnings = append(verified, rep.Warnings...)
	runChecks(st.checks, bundles, whatIf)
	if simulate {
		// Only tools_used depends on the outcomes of the session's earlier
		// calls: session_calls counts every decided call, so a bundle that
		// reads only context.session.calls or .id is decided call by call.
		hidden := st.hiddenOf(st.checks)
		runChecks(hidden, nil, whatIf)
		whatIfSessions(st.checks, hidden, used, whatIf)
	}
	summarize(rep, st.checks)
	if err := checkRecorded(rep, bundles, st.recorded); err != nil {
		return nil, err
	}
	return rep, nil
}

// loadBundles loads the bundles of --policy, by digest, and the what-if
// bundle (nil without one), naming them in rep.
func loadBundles(ctx context.Context, opts *Options, rep *Report) (map[digest.Digest]*policy.Bundle, *policy.Bundle, error) {
	bundles := map[digest.Digest]*policy.Bundle{}
	for _, p := range opts.Policies {
		b, err := policy.Load(ctx, p, policy.LoadOptions{})
		if err != nil {
			return nil, nil, err
		}
		bundles[b.Digest()] = b
		rep.Bundles[b.Digest().String()] = p
	}
	if opts.WhatIf == "" {
		return bundles, nil, nil
	}
	b, err := policy.Load(ctx, opts.WhatIf, policy.LoadOptions{})
	if err != nil {
		return nil, nil, err
	}
	rep.WhatIf = b.Digest().String() + " (" + opts.WhatIf + ")"
	return bundles, b, nil
}

// readLog reads the log once: the records are replayed as Verify reaches them
// (decoded ahead on all cores), and the report is only returned once Verify
// has accepted the whole log. A log that does not verify is an error unless
// opts.Unverified: it is then read again without the chain checks, into a
// new report (the readState's).
func readLog(ctx context.Context, dir string, opts *Options, rep *Report, simulate bool) (*readState, *auditlog.Report, error) {
	st := newReadState(rep, opts, simulate)
	vo := opts.Verify
	vo.Progress = nil
	vo.Decode = replayed
	vo.OnRecord = func(e *auditlog.Entry) error {
		if rep.Summary.Records%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		st.add(e)
		return nil
	}
	vrep, verr := auditlog.Verify(dir, vo)
	if verr != nil {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		if !opts.Unverified {
			return nil, nil, &NotVerifiedError{Err: verr}
		}
		// Replay what the log holds anyway, every line marked: the records
		// after the failure too, read without the chain checks.
		rep = &Report{Log: dir, Bundles: rep.Bundles, WhatIf: rep.WhatIf, Unverified: verr.Error()}
		st = newReadState(rep, opts, simulate)
		if err := st.readAll(ctx, dir); err != nil && st.failed == nil {
			st.failed = err
		}
	}
	if st.failed != nil {
		if errors.Is(st.failed, context.Canceled) || errors.Is(st.failed, context.DeadlineExceeded) {
			return nil, nil, st.failed
		}
		return nil, nil, &ReadError{Err: st.failed, Unverified: rep.Unverified != ""}
	}
	return st, vrep, nil
}

// verification carries the verification's outcome over to the replay: an
// unverified log marks every session and call; otherwise what the
// verification could not establish holds for the replay too (a tail no
// signature covers, a log that may have been cut), and verification
// returns its warnings, to come first.
func verification(rep *Report, vrep *auditlog.Report) []string {
	if rep.Unverified != "" {
		for _, s := range rep.Sessions {
			s.Unverified = true
		}
		for _, c := range rep.Calls {
			c.Unverified = true
		}
		return nil
	}
	var verified []string
	for _, w := range vrep.Warnings {
		verified = append(verified, VerifyWarning+w)
	}
	unsigned(rep, vrep)
	return verified
}

// sessionUses returns what each session's decided calls say about the
// decision inputs of its later ones. The gateway counts a session's decided
// calls: whatever order the records landed in, their session_calls must be
// 0, 1, ..., n-1 (warned of when they are not).
func (st *readState) sessionUses() map[sessionKey]*sessionUse {
	used := map[sessionKey]*sessionUse{}
	for k, calls := range st.facts {
		u := newSessionUse(calls)
		used[k] = u
		if u.contiguous < len(calls) {
			st.rep.Warnings = append(st.rep.Warnings, fmt.Sprintf("epoch %d, session %s: the recorded session_calls are not 0..%d (a decided call is missing from the log, or its facts were altered)", k.epoch, k.id, len(calls)-1))
		}
	}
	return used
}

// warnStrays counts the result records that fit no call beyond those
// listed.
func (st *readState) warnStrays() {
	if st.strays > maxStrays {
		st.rep.Warnings = append(st.rep.Warnings, fmt.Sprintf("result records that fit no call: %d more than the %d listed", st.strays-maxStrays, maxStrays))
	}
}

// warnUnregistered warns of the forwarded calls to a tunnel machine that
// is not registered. A gateway that records machines records a
// registration before any call can go to that machine (epochs of older
// gateways hold no machine record and are not checked).
func (st *readState) warnUnregistered() {
	var unreg []string
	n := 0
	for _, u := range st.unregistered {
		if u.ep.machineRecords {
			if n++; len(unreg) < maxStrays {
				unreg = append(unreg, u.where)
			}
		}
	}
	if n > 0 {
		if n > len(unreg) {
			unreg = append(unreg, "...")
		}
		st.rep.Warnings = append(st.rep.Warnings, fmt.Sprintf("forwarded calls to a tunnel machine no machine record of their epoch registered before them: %d (epoch:record upstream/machine %s); the registration record is missing or the call's machine was altered", n, strings.Join(unreg, ", ")))
	}
}

// checkRecords checks every call's record against its epoch and session
// (Call.Inconsistent), and marks and warns of the forwarded calls without
// a result record.
func checkRecords(rep *Report, used map[sessionKey]*sessionUse) {
	var noResult []string
	for _, c := range rep.Calls {
		if c.acc == nil && c.Outcome == record.OutcomeForwarded && c.Result == "" {
			c.Result = ResultNone
			if rep.Summary.NoResult++; len(noResult) < maxStrays {
				noResult = append(noResult, fmt.Sprintf("%d:%d", c.Epoch, c.Index))
			}
		}
		if c.Inconsistent = inconsistency(c); c.Inconsistent == "" {
			c.Inconsistent = inputs(c, used[sessionKey{c.Epoch, c.Session}])
		}
		if c.Inconsistent != "" {
			rep.Summary.Inconsistent++
		}
	}
	if n := rep.Summary.NoResult; n > 0 {
		if n > len(noResult) {
			noResult = append(noResult, "...")
		}
		// Not a finding: a gateway that stops before the upstream answers
		// leaves a forwarded call without one, as does a call in progress.
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("forwarded calls without a result record: %d (epoch:record %s); the call was still in progress, the gateway stopped before it ended, or the result record was removed", n, strings.Join(noResult, ", ")))
	}
}

// summarize counts the outcomes of the checks and the calls and accesses
// reported, and lets go of the records the calls kept.
func summarize(rep *Report, checks []*Call) {
	for _, c := range checks {
		if c.Replay != nil {
			rep.Summary.count(c.Replay.Status)
		}
		if c.WhatIf != nil {
			switch c.WhatIf.Status {
			case StatusChanges:
				rep.Summary.Changes++
			case StatusUnchanged:
			case StatusTampered:
				// A vault payload that does not match its commitment is a
				// finding, whichever check opened it (counted once).
				if c.Replay == nil || c.Replay.Status != StatusTampered {
					rep.Summary.Tampered++
				}
			default:
				rep.Summary.WhatIfNotEvaluated++
			}
		}
	}
	for _, c := range rep.Calls {
		if c.acc != nil {
			rep.Summary.Accesses++
		}
		c.rec, c.acc, c.ep = nil, nil, nil
	}
	rep.Summary.Calls = len(rep.Calls) - rep.Summary.Accesses
}

// checkRecorded refuses a --policy bundle whose digest the log never
// recorded: it cannot have decided any call.
func checkRecorded(rep *Report, bundles map[digest.Digest]*policy.Bundle, recorded map[digest.Digest]bool) error {
	for d, b := range bundles {
		if !recorded[d] {
			var have []string
			for r := range recorded {
				have = append(have, r.String())
			}
			slices.Sort(have)
			if len(have) == 0 {
				have = []string{"none"}
			}
			return exitcode.Errorf(exitcode.ExitMismatch, "policy bundle %s has digest %s, which the log never recorded (recorded: %s)", rep.Bundles[d.String()], d, strings.Join(have, ", ")).
				Hint("--policy replays the bundle that decided the calls; to try another bundle use --what-if %s", b.Dir())
		}
	}
	return nil
}

// unsigned marks the calls and sessions whose records (a call's, or its
// result's) come after their epoch's last checkpoint, and warns of the calls.
func unsigned(rep *Report, vrep *auditlog.Report) {
	signedTo := map[int]int64{} // epoch -> index of its last checkpoint
	var tails []string
	for _, e := range vrep.Epochs {
		signedTo[e.Epoch] = e.LastCheckpointAt
		if e.Records-1 > e.LastCheckpointAt {
			tails = append(tails, fmt.Sprintf("epoch %d records %d-%d", e.Epoch, e.LastCheckpointAt+1, e.Records-1))
		}
	}
	if len(tails) == 0 {
		return
	}
	for _, s := range rep.Sessions {
		s.Unsigned = s.last > signedTo[s.Epoch]
	}
	for _, c := range rep.Calls {
		// The call's outcome comes from its result record too: a forged
		// result of a signed call is as unproven as a forged call.
		if c.Index > signedTo[c.Epoch] || c.resultAt > signedTo[c.Epoch] {
			c.Unsigned = true
			rep.Summary.Unsigned++
		}
	}
	if n := rep.Summary.Unsigned; n > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("UNSIGNED: %d of the calls are in records no checkpoint signed by their epoch's key covers (%s): anyone able to write the log could have written them, so their replay proves nothing (--require-signed fails on them)", n, strings.Join(tails, ", ")))
	}
}

func (s *Summary) count(status string) {
	switch status {
	case StatusSame:
		s.Same++
	case StatusDiffers:
		s.Differs++
	case StatusNotReplayable:
		s.NotReplayable++
	case StatusTampered:
		s.Tampered++
	case StatusNoBundle:
		s.NoBundle++
	case StatusNoDecision:
		s.NoDecision++
	case StatusIncomplete:
		s.Incomplete++
	}
	// StatusInconsistent: Inconsistent counts every inconsistent call, with
	// or without a check.
}

func openVault(g *record.Genesis, dir string, ids []age.Identity) (*auditlog.Opener, error) {
	o, err := auditlog.NewOpener(g, ids...)
	if err != nil {
		return nil, err
	}
	if g.Commitments.Vault == "" {
		return o, fmt.Errorf("epoch %d was written without a payload vault", g.Epoch)
	}
	if err := o.LoadVault(dir, ids...); err != nil {
		return o, err
	}
	return o, nil
}

// request rebuilds the Cedar request of a call or access record (without
// the arguments or the URI).
func request(c *Call) *policy.Request {
	rec := c.rec
	if a := c.acc; a != nil {
		in := a.PolicyInput
		return &policy.Request{
			Action: policy.Action(a.Action), Agent: a.Agent, Groups: in.Groups,
			Upstream: a.Upstream, EvidenceClass: in.EvidenceClass, Prompt: a.Prompt,
			Session: policy.Session{ID: a.Session, Calls: in.SessionCalls, ToolsUsed: in.ToolsUsed},
			Time:    in.Time,
		}
	}
	in := rec.PolicyInput
	return &policy.Request{
		Action: policy.ActionCallTool, Agent: rec.Agent, Groups: in.Groups,
		Tool: rec.Tool, ToolName: rec.UpstreamTool, Upstream: rec.Upstream, EvidenceClass: in.EvidenceClass, Machine: in.Machine,
		Annotations: policy.Annotations{ReadOnly: in.Hints.ReadOnly, Destructive: in.Hints.Destructive, Idempotent: in.Hints.Idempotent, OpenWorld: in.Hints.OpenWorld},
		Session:     policy.Session{ID: rec.Session, Calls: in.SessionCalls, ToolsUsed: in.ToolsUsed},
		Time:        in.Time,
	}
}

// arguments supplies the call's arguments (an access's URI) when the
// decision needs them. It returns a non-nil Check when the call cannot be
// evaluated.
func arguments(c *Call, memo *policy.Memo, req *policy.Request) *Check {
	if c.acc != nil {
		return accessURI(c, memo, req)
	}
	rec, ep := c.rec, c.ep
	need := memo.DependsOnArguments(req)
	for _, e := range rec.PolicyInput.Errors {
		if strings.HasPrefix(e, "arguments: ") {
			need = true // the recorded decision came from the arguments' form
		}
	}
	if !need {
		return nil
	}
	if rec.Args.IsZero() {
		return &Check{Status: StatusIncomplete, Reason: "its decision depends on the arguments, and the record has no commitment to them: it cannot come from the gateway"}
	}
	if ep.opener == nil {
		return ep.notOpened("arguments")
	}
	p, err := ep.opener.Payload(rec.Args)
	switch {
	case errors.Is(err, auditlog.ErrNoPayload):
		return &Check{Status: StatusNotReplayable, Reason: fmt.Sprintf("its decision depends on the arguments, and the vault has no payload for commitment %d", rec.Args.ID),
			Why: "its decision reads the arguments, and the vault has no payload for them"}
	case errors.Is(err, auditlog.ErrPayloadMismatch):
		return &Check{Status: StatusTampered, Reason: fmt.Sprintf("the vault's arguments do not match the commitment in the log (commitment %d, %d bytes): the vault was altered", rec.Args.ID, rec.Args.Size)}
	case err != nil:
		return &Check{Status: StatusNotReplayable, Reason: "its decision depends on the arguments, and the vault's payload cannot be opened: " + err.Error(),
			Why: "its decision reads the arguments, and the vault's payload for them cannot be opened"}
	}
	req.Arguments = p
	return nil
}

// accessURI supplies an access's URI from the vault when the decision
// needs it (the log holds only its commitment), as arguments does a call's
// arguments.
func accessURI(c *Call, memo *policy.Memo, req *policy.Request) *Check {
	a, ep := c.acc, c.ep
	if req.Action != policy.ActionReadResource || !memo.DependsOnURI(req) {
		return nil
	}
	if a.URI.IsZero() {
		return &Check{Status: StatusIncomplete, Reason: "a read_resource record without the commitment to its URI: it cannot come from the gateway"}
	}
	if ep.opener == nil {
		return ep.notOpened("resource URI")
	}
	p, err := ep.opener.Payload(a.URI)
	switch {
	case errors.Is(err, auditlog.ErrNoPayload):
		return &Check{Status: StatusNotReplayable, Reason: fmt.Sprintf("its decision depends on the resource URI, and the vault has no payload for commitment %d", a.URI.ID),
			Why: "its decision reads the resource URI, and the vault has no payload for it"}
	case errors.Is(err, auditlog.ErrPayloadMismatch):
		return &Check{Status: StatusTampered, Reason: fmt.Sprintf("the vault's URI does not match the commitment in the log (commitment %d, %d bytes): the vault was altered", a.URI.ID, a.URI.Size)}
	case err != nil:
		return &Check{Status: StatusNotReplayable, Reason: "its decision depends on the resource URI, and the vault's payload cannot be opened: " + err.Error(),
			Why: "its decision reads the resource URI, and the vault's payload for it cannot be opened"}
	}
	req.URI = string(p)
	return nil
}

// notOpened is the check of a call whose decision reads what (the
// arguments, the resource URI) when the epoch's vault is not open: no
// --identity, or one that does not open it (warned of once for the epoch).
// Its texts are made once per epoch: a log may hold millions of such calls.
func (ep *epochState) notOpened(what string) *Check {
	if ck := ep.notOpen[what]; ck != nil {
		return &Check{Status: ck.Status, Reason: ck.Reason, Why: ck.Why}
	}
	ck := &Check{Status: StatusNotReplayable, Reason: "its decision depends on the " + what + "; pass --identity to open the payload vault",
		Why: "its decision reads the " + what + ": " + whyNoIdentity}
	if ep.openErr != nil {
		ck.Reason = "its decision depends on the " + what + ", and the vault cannot be opened: " + ep.openErr.Error()
		ck.Why = fmt.Sprintf("its decision reads the %s, and epoch %d's payload vault cannot be opened (see the warning)", what, ep.epoch)
	}
	ep.notOpenMu.Lock()
	defer ep.notOpenMu.Unlock()
	if ep.notOpen == nil {
		ep.notOpen = map[string]*Check{}
	}
	ep.notOpen[what] = ck
	return &Check{Status: ck.Status, Reason: ck.Reason, Why: ck.Why}
}

func effect(d policy.Decision) string {
	if d.Allow {
		return record.DecisionAllow
	}
	return record.DecisionDeny
}

func replayCall(c *Call, b *policy.Bundle, memo *policy.Memo) *Check {
	rec := c.rec
	switch {
	case rec.PolicyBundle.IsZero() && rec.PolicyInput == nil:
		return &Check{Status: StatusNoDecision, Reason: "no policy decided this call (mode " + rec.PolicyMode + ")"}
	case rec.PolicyInput == nil || rec.PolicyBundle.IsZero():
		return &Check{Status: StatusIncomplete, Reason: "the record has a decision but not the bundle digest and the decision's input: it cannot come from the gateway"}
	case b == nil:
		return &Check{Status: StatusNoBundle, Reason: "decided by bundle " + rec.PolicyBundle.String() + ", which was not given with --policy",
			Why: "decided by bundle " + rec.PolicyBundle.String() + ": pass it with --policy"}
	}
	req := request(c)
	if ck := arguments(c, memo, req); ck != nil {
		return ck
	}
	d := memo.Decide(req)
	ck := &Check{Decision: effect(d), PolicyIDs: d.PolicyIDs, Reason: d.Reason}
	if ck.Decision == rec.Decision && slices.Equal(d.PolicyIDs, rec.PolicyIDs) {
		ck.Status = StatusSame
	} else {
		ck.Status = StatusDiffers
		ck.Reason = fmt.Sprintf("recorded %s by [%s], replay gives %s by [%s]", rec.Decision, strings.Join(rec.PolicyIDs, ", "), ck.Decision, strings.Join(d.PolicyIDs, ", "))
	}
	return ck
}

// hides reports whether a replay status would pass over an inconsistent
// record: the record's own contradiction is then the call's status.
func hides(status string) bool {
	switch status {
	case StatusSame, StatusNoBundle, StatusNoDecision, StatusNotReplayable:
		return true
	}
	return false
}

// inconsistency returns how a call record contradicts itself or the policy
// its epoch recorded, or "" if it does not. A replay against the bundle
// cannot see these: a forwarded deny replays as the same deny, and a record
// that names a bundle no one put in force, or no bundle at all, is not
// replayed. The gateway never writes them (see gateway.Decision.Refuses and
// relay), so each is a record altered after the decision, or a gateway
// that did not do what it recorded.
func inconsistency(c *Call) string {
	rec, ep := c.rec, c.ep
	if c.acc != nil {
		if why := accessShape(c); why != "" {
			return why
		}
	}
	if c.contra != "" {
		return c.contra
	}
	// The gateway commits to a call's arguments before anything else ({}
	// when none were sent, see relay); only a call refused before the
	// pipeline saw it (recordRefusedCall: an invalid request) has none,
	// and no decision.
	if c.acc == nil && rec.Args.IsZero() && (c.Outcome == record.OutcomeForwarded || rec.PolicyInput != nil) {
		return fmt.Sprintf("a %s call record without the commitment to its arguments: the gateway commits to the arguments of every call it decides or forwards", c.Outcome)
	}
	if c.Outcome == record.OutcomeForwarded && c.Decision != record.DecisionAllow && c.Mode != string(policy.Advisory) && c.Mode != string(policy.Silent) {
		return fmt.Sprintf("recorded %s in mode %s, yet forwarded: only the advisory and silent modes forward a denied call", c.Decision, c.Mode)
	}
	if c.Outcome == record.OutcomeRefused && c.Result != "" {
		return fmt.Sprintf("recorded refused, yet result record %d (%s) answers it: a refused call is never sent", c.resultAt, c.Result)
	}
	if len(ep.policies) == 0 {
		if !rec.PolicyBundle.IsZero() {
			return fmt.Sprintf("decided by bundle %s, but epoch %d runs no policy: neither its genesis nor a policy record of the epoch names a bundle", rec.PolicyBundle, c.Epoch)
		}
		return ""
	}
	// A call decided just before a reload can be written after the reload's
	// record (it waits for its upstream in between), and one decided just
	// after it before: a call may carry any state its epoch put in force up
	// to the first one recorded after it.
	known := ep.policies[:min(c.npol+1, len(ep.policies))]
	inForce := known[max(c.npol, 1)-1] // the state in force when the call was written (or the first)
	if rec.PolicyBundle.IsZero() || rec.PolicyInput == nil {
		if c.Outcome == record.OutcomeForwarded {
			return fmt.Sprintf("forwarded without a policy decision (mode %s), but epoch %d runs bundle %s in mode %s (record %d): the gateway decides every call it forwards", orNone(c.Mode), c.Epoch, inForce.bundle, inForce.mode, inForce.at)
		}
		return "" // refused before the decision (unknown tool, kill switch, shutdown)
	}
	var modes []string
	for _, p := range known {
		if p.bundle.Equal(rec.PolicyBundle) {
			if p.mode == c.Mode {
				return ""
			}
			modes = append(modes, p.mode)
		}
	}
	if len(modes) == 0 {
		return fmt.Sprintf("decided by bundle %s, which neither epoch %d's genesis nor its policy records put in force (in force: %s, record %d)", rec.PolicyBundle, c.Epoch, inForce.bundle, inForce.at)
	}
	slices.Sort(modes)
	return fmt.Sprintf("recorded mode %s, but epoch %d ran bundle %s in mode %s", orNone(c.Mode), c.Epoch, rec.PolicyBundle, strings.Join(slices.Compact(modes), " or "))
}

// accessShape returns how an access record's method and action disagree,
// or "": the gateway decides resources/read and resources/subscribe as
// read_resource, prompts/get as get_prompt, completion/complete as either.
func accessShape(c *Call) string {
	want := map[string][]string{
		"resources/read": {"read_resource"}, "resources/subscribe": {"read_resource"},
		"prompts/get": {"get_prompt"}, "completion/complete": {"read_resource", "get_prompt"},
	}[c.Method]
	if !slices.Contains(want, c.Action) {
		return fmt.Sprintf("an access record with method %q and action %q: the gateway never writes that pair", c.Method, c.Action)
	}
	return ""
}

func orNone(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

func whatIfCall(c *Call, b *policy.Bundle, memo *policy.Memo) *Check {
	return whatIfUsing(c, memo, nil, false)
}

// whatIfUsing is whatIfCall with the session's tools_used replaced by used
// when override is set.
func whatIfUsing(c *Call, memo *policy.Memo, used []string, override bool) *Check {
	rec := c.rec
	if rec.PolicyInput == nil {
		return &Check{Status: StatusNoDecision, Reason: "the record holds no policy input (no policy decided this call)"}
	}
	req := request(c)
	if override {
		req.Session.ToolsUsed = used
	}
	if ck := arguments(c, memo, req); ck != nil {
		return ck
	}
	d := memo.Decide(req)
	ck := &Check{Decision: effect(d), PolicyIDs: d.PolicyIDs, Reason: d.Reason, Status: StatusUnchanged}
	if ck.Decision != rec.Decision {
		ck.Status = StatusChanges
	}
	return ck
}

// runChecks re-evaluates the calls on every core. Each check only reads its
// call record, its epoch's vault and the bundles.
func runChecks(calls []*Call, bundles map[digest.Digest]*policy.Bundle, whatIf *policy.Bundle) {
	memos := map[digest.Digest]*policy.Memo{}
	for d, b := range bundles {
		memos[d] = b.NewMemo()
	}
	var whatIfMemo *policy.Memo
	if whatIf != nil {
		whatIfMemo = whatIf.NewMemo()
	}
	workers := runtime.GOMAXPROCS(0)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(256)) - 256
				if i >= len(calls) {
					return
				}
				for _, c := range calls[i:min(i+256, len(calls))] {
					if len(bundles) > 0 {
						c.Replay = replayCall(c, bundles[c.rec.PolicyBundle], memos[c.rec.PolicyBundle])
						if c.Inconsistent != "" && hides(c.Replay.Status) {
							c.Replay = &Check{Status: StatusInconsistent, Reason: c.Inconsistent}
						}
					}
					if whatIf != nil {
						c.WhatIf = whatIfCall(c, whatIf, whatIfMemo)
					}
				}
			}
		}()
	}
	wg.Wait()
}

type sessionKey struct {
	epoch int
	id    string
}

// readState builds the timeline from the records, in log order.
type readState struct {
	rep      *Report
	opts     *Options
	checking bool
	recorded map[digest.Digest]bool
	sessions map[sessionKey]*Session
	facts    map[sessionKey][]decided // every decided call of a session
	ep       *epochState
	checks   []*Call
	// hidden are the decided calls the filter left out, kept (keepHidden)
	// when a what-if bundle reads tools_used: the filter restricts what is
	// reported, not the sessions simulated.
	hidden     []*Call
	keepHidden bool
	failed     error // the first record that cannot be replayed
	strays     int   // result records that fit no call

	lastBundle    digest.Digest // and its String, shared by the calls
	lastBundleStr string

	// unregistered are the forwarded calls naming a tunnel machine no
	// machine record of their epoch registered before them.
	unregistered []unregisteredCall
}

type unregisteredCall struct {
	ep    *epochState
	where string
}

func newReadState(rep *Report, opts *Options, simulate bool) *readState {
	return &readState{rep: rep, opts: opts, checking: len(opts.Policies) > 0 || opts.WhatIf != "",
		keepHidden: simulate && opts.Filter != (Filter{}),
		recorded:   map[digest.Digest]bool{}, sessions: map[sessionKey]*Session{}, facts: map[sessionKey][]decided{}}
}

// hiddenOf returns the decided calls the filter left out that belong to a
// session of some decided call in checks: their what-if outcomes give the
// session's tools_used.
func (st *readState) hiddenOf(checks []*Call) []*Call {
	if len(st.hidden) == 0 {
		return nil
	}
	want := map[sessionKey]bool{}
	for _, c := range checks {
		if c.rec.PolicyInput != nil {
			want[sessionKey{c.Epoch, c.Session}] = true
		}
	}
	var h []*Call
	for _, c := range st.hidden {
		if want[sessionKey{c.Epoch, c.Session}] {
			h = append(h, c)
		}
	}
	st.hidden = nil
	return h
}

// replayed reports whether replay reads the records of kind k.
func replayed(k record.Kind) bool {
	switch k {
	case record.KindGenesis, record.KindSession, record.KindCall, record.KindAccess, record.KindResult, record.KindPolicy, record.KindAdmin, record.KindMachine:
		return true
	}
	return false
}

// add replays one record: it counts it, decodes it and hands it to the
// method of its kind.
func (st *readState) add(e *auditlog.Entry) {
	rep, opts := st.rep, st.opts
	rep.Summary.Records++
	if opts.Progress != nil && rep.Summary.Records%4096 == 0 {
		opts.Progress(rep.Summary.Records)
	}
	if st.failed != nil || !replayed(e.Kind) {
		return
	}
	r, err := e.Decode()
	if err != nil {
		st.failed = err
		return
	}
	switch rec := r.(type) {
	case *record.Genesis:
		st.genesis(e, rec)
	case *record.Policy:
		st.policy(e, rec)
	case *record.Machine:
		st.machine(rec)
	case *record.Admin:
		st.admin(e, rec)
	case *record.Session:
		st.session(e, rec)
	case *record.Call:
		st.call(e, rec)
	case *record.Access:
		st.access(e, rec)
	case *record.Result:
		st.result(e, rec)
	}
}

// genesis starts an epoch: the bundle and mode it puts in force, and its
// payload vault, opened with the --identity given (warned of when it cannot
// be).
func (st *readState) genesis(e *auditlog.Entry, rec *record.Genesis) {
	rep, opts, pos := st.rep, st.opts, &e.Pos
	ep := &epochState{epoch: pos.Epoch, dir: filepath.Dir(pos.File), genesis: rec, calls: map[int64]*Call{}}
	st.ep = ep
	if !rec.PolicyDigest.IsZero() {
		st.recorded[rec.PolicyDigest] = true
		ep.policies = append(ep.policies, policyState{rec.PolicyDigest, rec.PolicyMode, pos.Index})
	}
	if len(opts.Identities) == 0 {
		return
	}
	ep.opener, ep.openErr = openVault(rec, ep.dir, opts.Identities)
	if ep.openErr != nil {
		w := fmt.Sprintf("epoch %d: the payload vault cannot be opened with the --identity given: %v; its calls whose decision reads the arguments (or a resource URI) are not replayable", pos.Epoch, ep.openErr)
		var nm *age.NoIdentityMatchError
		if errors.As(ep.openErr, &nm) {
			w += " (" + whyNoIdentity + ")"
		}
		rep.Warnings = append(rep.Warnings, w)
		return
	}
	if n := ep.opener.VaultTorn(); n > 0 {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("epoch %d: the payload vault %s ends with an incomplete line of %d bytes (the gateway stopped while writing it): that payload is lost, and a call that needs it is not replayable", pos.Epoch, filepath.Join(ep.dir, auditlog.VaultFile), n))
	}
}

// policy records a bundle the log names, and the state a load or reload
// puts in force.
func (st *readState) policy(e *auditlog.Entry, rec *record.Policy) {
	if rec.Bundle.IsZero() {
		return
	}
	st.recorded[rec.Bundle] = true
	// A rejected reload names no bundle; the one in force stays.
	if st.ep != nil && (rec.Event == "loaded" || rec.Event == "reloaded") {
		st.ep.policies = append(st.ep.policies, policyState{rec.Bundle, rec.Mode, e.Pos.Index})
	}
}

// machine records a tunnel machine's registration in the epoch.
func (st *readState) machine(rec *record.Machine) {
	ep := st.ep
	if ep == nil {
		return
	}
	ep.machineRecords = true
	if rec.Event == record.MachineRegistered {
		if ep.machines == nil {
			ep.machines = map[string]bool{}
		}
		ep.machines[rec.Upstream+"\x00"+rec.Machine] = true
	}
}

// admin follows the epoch's kill switch.
func (st *readState) admin(e *auditlog.Entry, rec *record.Admin) {
	if st.ep == nil {
		return
	}
	switch rec.Action {
	case "kill_switch_on":
		if st.ep.killedAt == 0 {
			st.ep.killedAt = e.Pos.Index + 1
		}
	case "kill_switch_off":
		st.ep.killedAt = 0
	}
}

// session adds a session to the timeline at its first record, and its
// start and end.
func (st *readState) session(e *auditlog.Entry, rec *record.Session) {
	pos := &e.Pos
	key := sessionKey{pos.Epoch, rec.ID}
	s := st.sessions[key]
	if s == nil {
		s = &Session{Epoch: pos.Epoch, ID: rec.ID, Agent: rec.Agent, Front: rec.Front, Client: strings.TrimSpace(rec.ClientName + " " + rec.ClientVersion)}
		st.sessions[key] = s
		st.rep.Sessions = append(st.rep.Sessions, s)
	}
	switch rec.Event {
	case "start":
		s.Start = e.Time
	case "end":
		s.End = e.Time
	}
	s.last = pos.Index
}

// call adds a tools/call to the timeline (if the filter selects it), and
// what it says of its epoch and session: a machine it was forwarded to, a
// commitment number, the session's decided calls.
func (st *readState) call(e *auditlog.Entry, rec *record.Call) {
	pos, ep := &e.Pos, st.ep
	if ep == nil {
		st.failed = fmt.Errorf("%s: call record before any genesis record", pos)
		return
	}
	// A call record's own bundle is not "recorded": only the genesis
	// and policy records say which bundles the gateway put in force
	// (inconsistency reports a call that names another).
	ep.isCall.set(pos.Index)
	if rec.Machine != "" && rec.Outcome == record.OutcomeForwarded && !ep.machines[rec.Upstream+"\x00"+rec.Machine] {
		st.unregistered = append(st.unregistered, unregisteredCall{ep, fmt.Sprintf("%d:%d %s/%s", pos.Epoch, pos.Index, rec.Upstream, rec.Machine)})
	}
	contra := ep.killed(rec.Outcome)
	if ep.commit(rec.Args) {
		contra = reusedMsg("its arguments'", rec.Args)
	}
	key := sessionKey{pos.Epoch, rec.Session}
	if rec.PolicyInput != nil {
		// The engine adds the tool to the session's tools_used unless
		// the policy refused the call (policy.Engine.DecideCall).
		refused := rec.Decision != record.DecisionAllow && rec.PolicyMode == string(policy.Enforcing)
		st.facts[key] = append(st.facts[key], decided{rec.PolicyInput.SessionCalls, rec.Tool, !refused, pos.Index})
	}
	c := &Call{Epoch: pos.Epoch, Index: pos.Index, Time: e.Time, Session: rec.Session, Agent: rec.Agent, Tool: rec.Tool,
		Upstream: rec.Upstream, EvidenceClass: rec.EvidenceClass, Decision: rec.Decision, PolicyIDs: rec.PolicyIDs,
		Mode: rec.PolicyMode, Outcome: rec.Outcome, Reason: rec.Reason, rec: rec, ep: ep, npol: len(ep.policies), contra: contra}
	c.Bundle = st.bundleString(rec.PolicyBundle)
	if s := st.sessions[key]; s != nil {
		s.Calls++
	}
	if !st.opts.Filter.match(c) {
		if st.keepHidden && rec.PolicyInput != nil {
			st.hidden = append(st.hidden, c)
		}
		return
	}
	ep.calls[pos.Index] = c
	st.report(c)
}

// access adds an access (resources/read, prompts/get, ...) to the timeline
// if the filter selects it, as a call whose decision is in the shape of a
// call record's.
func (st *readState) access(e *auditlog.Entry, rec *record.Access) {
	pos, ep := &e.Pos, st.ep
	if ep == nil {
		st.failed = fmt.Errorf("%s: access record before any genesis record", pos)
		return
	}
	contra := ep.killed(rec.Outcome)
	if ep.commit(rec.URI) {
		contra = reusedMsg("its URI's", rec.URI)
	}
	if ep.commit(rec.Args) {
		contra = reusedMsg("its arguments'", rec.Args)
	}
	// The decision's fields in the shape of a call record, so that the
	// checks and the consistency rules of calls apply as they are; Args
	// is the URI's commitment. Accesses do not count in the session's
	// calls (session_calls counts tools/call only).
	crec := &record.Call{Session: rec.Session, Agent: rec.Agent, Upstream: rec.Upstream, EvidenceClass: rec.EvidenceClass,
		Args: rec.URI, Decision: rec.Decision, PolicyIDs: rec.PolicyIDs, PolicyMode: rec.PolicyMode, PolicyBundle: rec.PolicyBundle,
		Outcome: rec.Outcome, Reason: rec.Reason}
	if in := rec.PolicyInput; in != nil {
		crec.PolicyInput = &record.PolicyInput{Groups: in.Groups, EvidenceClass: in.EvidenceClass, SessionCalls: in.SessionCalls,
			ToolsUsed: in.ToolsUsed, Time: in.Time, Errors: in.Errors}
	}
	c := &Call{Epoch: pos.Epoch, Index: pos.Index, Time: e.Time, Session: rec.Session, Agent: rec.Agent,
		Action: rec.Action, Method: rec.Method, Prompt: rec.Prompt,
		Upstream: rec.Upstream, EvidenceClass: rec.EvidenceClass, Decision: rec.Decision, PolicyIDs: rec.PolicyIDs,
		Mode: rec.PolicyMode, Outcome: rec.Outcome, Reason: rec.Reason, rec: crec, acc: rec, ep: ep, npol: len(ep.policies), contra: contra}
	c.Bundle = st.bundleString(rec.PolicyBundle)
	if !st.opts.Filter.match(c) {
		return
	}
	st.report(c)
}

// bundleString returns a call's bundle digest as a string ("" for none), the
// same string for the calls of a bundle.
func (st *readState) bundleString(d digest.Digest) string {
	if d.IsZero() {
		return ""
	}
	if !d.Equal(st.lastBundle) {
		st.lastBundle, st.lastBundleStr = d, d.String()
	}
	return st.lastBundleStr
}

// report lists a call or access the filter selected, and checks it when
// there is a bundle to check it against.
func (st *readState) report(c *Call) {
	st.rep.Calls = append(st.rep.Calls, c)
	if st.checking {
		st.checks = append(st.checks, c)
	}
}

// result gives a call its result and latency: the gateway writes one
// result for each forwarded call, after it.
func (st *readState) result(e *auditlog.Entry, rec *record.Result) {
	pos, ep := &e.Pos, st.ep
	if ep == nil {
		return
	}
	// A result that names no call, or a second one, is not shown as the
	// call's (the first is kept); a crash cannot cause either, but they
	// hide nothing that a call record says, so they are warnings.
	if ep.commit(rec.Result) {
		if c := ep.calls[rec.Call]; c != nil {
			c.contra = reusedMsg(fmt.Sprintf("its result (record %d) uses", pos.Index), rec.Result)
		}
	}
	switch {
	case rec.Call >= pos.Index || !ep.isCall.has(rec.Call):
		st.stray(fmt.Sprintf("epoch %d: result record %d (%s) names record %d, which is no call record before it: the result belongs to no call", pos.Epoch, pos.Index, rec.Outcome, rec.Call))
	case ep.answered.has(rec.Call):
		st.stray(fmt.Sprintf("epoch %d: result record %d (%s) is a second result for call %d: only the first is shown", pos.Epoch, pos.Index, rec.Outcome, rec.Call))
	default:
		ep.answered.set(rec.Call)
		if c := ep.calls[rec.Call]; c != nil {
			c.Result, c.LatencyMicros, c.resultAt = rec.Outcome, rec.LatencyMicros, pos.Index
			delete(ep.calls, rec.Call)
		}
	}
}

// maxStrays bounds the warnings listed one by one for results that fit no
// call, and the calls a warning names.
const maxStrays = 20

func (st *readState) stray(msg string) {
	if st.strays++; st.strays <= maxStrays {
		st.rep.Warnings = append(st.rep.Warnings, msg)
	}
}

// readAll replays every record of the log with a Reader, which checks each
// line's form but not the chain (--unverified).
func (st *readState) readAll(ctx context.Context, dir string) error {
	r, err := auditlog.NewReader(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	for n := 0; ; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		e, err := r.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		st.add(e)
	}
}

// decided is a call the policy decided, as its record says: its
// session_calls, its tool, and whether the tool joined the session's
// tools_used (it was not refused by the policy).
type decided struct {
	n    int64
	tool string
	used bool
	at   int64 // its record's index
}

// sessionUse is what a session's decided calls say about the decision
// inputs of its later calls and accesses.
type sessionUse struct {
	calls []decided // sorted by session_calls
	// prefix[i] is tools_used after calls[:i]: sorted, unique, shared
	// while it does not change.
	prefix [][]string
	// contiguous is the length of the prefix of calls whose session_calls
	// are 0, 1, ...: the calls decided before one with session_calls n <=
	// contiguous are all in the log.
	contiguous int
}

func newSessionUse(calls []decided) *sessionUse {
	slices.SortStableFunc(calls, func(a, b decided) int { return cmp.Compare(a.n, b.n) })
	u := &sessionUse{calls: calls, prefix: make([][]string, len(calls)+1), contiguous: len(calls)}
	var cur []string
	for i, c := range calls {
		u.prefix[i] = cur
		if c.n != int64(i) && u.contiguous == len(calls) {
			u.contiguous = i
		}
		if j, found := slices.BinarySearch(cur, c.tool); c.used && !found {
			cur = slices.Insert(slices.Clip(cur), j, c.tool)
		}
	}
	u.prefix[len(calls)] = cur
	return u
}

// Bounds on a decision's recorded time (policy_input.time) against its
// record's ts. Both come from the gateway's wall clock, the decision first:
// relay and decideAccess decide, then append the record. clockSlack allows
// for the decision time's truncation to the millisecond and for the wall
// clock being stepped meanwhile. A forwarded call's record is written
// within its result's latency of its decision (measured from before the
// decision to after the record); any other record (a refused call, one
// without a result, an access) within maxDecisionLag, far more than the
// gateway ever waits between the two (starting an upstream,
// server.connect_timeout, and the record's group commit).
const (
	clockSlack     = time.Minute
	maxDecisionLag = 24 * time.Hour
)

// inputs returns how a call's or access's recorded decision inputs
// contradict the log, or "": its tools_used must be the tools of the
// session's calls decided before it (lower session_calls) that the policy
// did not refuse, as the engine keeps them, and its time must fall before
// its record's ts, and not long before. A record rewritten to have the
// policy decide on inputs that never were (a tools_used emptied so that a
// policy reading it allows, a time set back) is thus inconsistent even
// though it replays to its recorded decision.
func inputs(c *Call, u *sessionUse) string {
	in := c.rec.PolicyInput
	if in == nil {
		return ""
	}
	if !c.Time.IsZero() {
		bound, why := maxDecisionLag, "within "+maxDecisionLag.String()
		if c.acc == nil && c.Outcome == record.OutcomeForwarded && c.resultAt > 0 {
			bound = time.Duration(c.LatencyMicros) * time.Microsecond
			why = fmt.Sprintf("within the call's latency (%s, its result record %d)", bound, c.resultAt)
		}
		switch lag := c.Time.Sub(in.Time); {
		case lag < -clockSlack:
			return fmt.Sprintf("decided at %s, after its record was written at %s: the gateway decides, then writes the record", in.Time.Format(time.RFC3339Nano), c.Time.Format(time.RFC3339Nano))
		case lag > bound+clockSlack:
			return fmt.Sprintf("decided at %s, but its record was written at %s, %s later: the gateway writes a record %s of its decision (give or take %s)", in.Time.Format(time.RFC3339Nano), c.Time.Format(time.RFC3339Nano), lag.Round(time.Millisecond), why, clockSlack)
		}
	}
	var want []string
	var before []decided
	span := "none"
	complete := true
	if n := in.SessionCalls; n > 0 {
		span = fmt.Sprintf("0-%d", n-1)
		if n == 1 {
			span = "0"
		}
		complete = u != nil && n <= int64(u.contiguous)
	}
	if u != nil {
		p, _ := slices.BinarySearchFunc(u.calls, in.SessionCalls, func(d decided, n int64) int { return cmp.Compare(d.n, n) })
		want, before = u.prefix[p], u.calls[:p]
	}
	// whence names the record that put each tool in tools_used.
	whence := func(tools []string) string {
		var w []string
		for _, t := range tools {
			if i := slices.IndexFunc(before, func(d decided) bool { return d.used && d.tool == t }); i >= 0 {
				w = append(w, fmt.Sprintf("%s from record %d", t, before[i].at))
			}
		}
		if len(w) == 0 {
			return ""
		}
		return " (" + strings.Join(w, ", ") + ")"
	}
	if complete && slices.Equal(in.ToolsUsed, want) {
		return ""
	}
	if !complete {
		// A decided call is missing (a warning says so): its tool may be
		// in tools_used, but every tool the log shows must be.
		var missing []string
		for _, t := range want {
			if !slices.Contains(in.ToolsUsed, t) {
				missing = append(missing, t)
			}
		}
		if len(missing) == 0 {
			return ""
		}
		return fmt.Sprintf("decided with tools_used [%s], without [%s], which the session's calls decided before it (session_calls %s) used%s: the engine keeps every tool the policy did not refuse", strings.Join(in.ToolsUsed, " "), strings.Join(missing, " "), span, whence(missing))
	}
	return fmt.Sprintf("decided with tools_used [%s] where the session's calls decided before it (session_calls %s) used [%s]%s: the engine keeps the tools of the session's calls the policy did not refuse", strings.Join(in.ToolsUsed, " "), span, strings.Join(want, " "), whence(want))
}

// whatIfSessions re-evaluates, under a what-if bundle that reads
// context.session.tools_used, the calls and accesses whose session's
// tools_used the what-if outcomes of its earlier calls change: each session
// is simulated in session_calls order (which the outcomes do not change:
// every decided call counts), a call's tool joining tools_used when the
// what-if bundle would let it through (allow, or any decision in a mode
// that forwards denies). hidden are the session's decided calls a filter
// left out of checks: simulated, not reported. Where an earlier call's
// what-if outcome is not known (not replayable) and could change the
// state, the later ones are not replayable, naming that call.
func whatIfSessions(checks, hidden []*Call, used map[sessionKey]*sessionUse, whatIf *policy.Bundle) {
	memo := whatIf.NewMemo()
	byKey := map[sessionKey][]*Call{}
	checked := map[[2]int64]*Call{}
	for _, c := range slices.Concat(checks, hidden) {
		if c.rec.PolicyInput == nil || c.WhatIf == nil {
			continue
		}
		k := sessionKey{c.Epoch, c.Session}
		byKey[k] = append(byKey[k], c)
		checked[[2]int64{int64(c.Epoch), c.Index}] = c
	}
	for k, items := range byKey {
		u := used[k]
		if u == nil {
			continue
		}
		slices.SortStableFunc(items, func(a, b *Call) int {
			return cmp.Compare(a.rec.PolicyInput.SessionCalls, b.rec.PolicyInput.SessionCalls)
		})
		var sim []string
		blocked, blockedWhy := "", ""
		next := 0
		for _, it := range items {
			n := it.rec.PolicyInput.SessionCalls
			for ; next < len(u.calls) && u.calls[next].n < n; next++ {
				d := u.calls[next]
				if _, found := slices.BinarySearch(sim, d.tool); found || blocked != "" {
					continue
				}
				c := checked[[2]int64{int64(k.epoch), d.at}]
				switch {
				case c == nil:
					blockedWhy = whyBlocked
					blocked = fmt.Sprintf("the what-if bundle reads context.session.tools_used, and whether call record %d (%s, session_calls %d) would put its tool in the session's tools_used is not known: it is not among the calls selected", d.at, d.tool, d.n)
				case c.WhatIf.Status != StatusUnchanged && c.WhatIf.Status != StatusChanges:
					blockedWhy = whyBlocked
					blocked = fmt.Sprintf("the what-if bundle reads context.session.tools_used, and whether call record %d (%s, session_calls %d) would put its tool in the session's tools_used is not known: its own what-if is %s", d.at, d.tool, d.n, c.WhatIf.Status)
				case c.WhatIf.Decision == record.DecisionAllow || c.Mode != string(policy.Enforcing):
					j, _ := slices.BinarySearch(sim, d.tool)
					sim = slices.Insert(slices.Clip(sim), j, d.tool)
				}
			}
			if slices.Equal(sim, it.rec.PolicyInput.ToolsUsed) && blocked == "" {
				continue // decided on the state it was recorded with
			}
			if blocked != "" {
				it.WhatIf = &Check{Status: StatusNotReplayable, Reason: blocked, Why: blockedWhy}
				continue
			}
			ck := whatIfUsing(it, memo, sim, true)
			if ck.Status == StatusUnchanged || ck.Status == StatusChanges {
				ck.Reason += fmt.Sprintf(" (with tools_used [%s] under the what-if bundle, recorded [%s])", strings.Join(sim, " "), strings.Join(it.rec.PolicyInput.ToolsUsed, " "))
			}
			it.WhatIf = ck
		}
	}
}
