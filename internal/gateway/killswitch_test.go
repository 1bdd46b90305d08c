package gateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/internal/metrics"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/replay"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestKillSwitchStaysEngagedWhenItsStateCannotBeRemoved: a clearing that is
// recorded but whose state file cannot be removed (a restart would engage
// the switch again) leaves the switch engaged, and a new kill_switch_on
// says why.
func TestKillSwitchStaysEngagedWhenItsStateCannotBeRemoved(t *testing.T) {
	h := newHarness(t, hconf{})
	state := filepath.Join(t.TempDir(), KillSwitchStateFile)
	h.g.opts.KillSwitchFile = state
	ctx := context.Background()
	if err := h.g.SetKillSwitch(ctx, true, "op", "incident"); err != nil {
		t.Fatal(err)
	}
	// Something puts a non-empty directory where the file was.
	if err := os.Remove(state); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(state, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	err := h.g.SetKillSwitch(ctx, false, "op", "resolved")
	if err == nil || !strings.Contains(err.Error(), "stays engaged") || !h.g.KillSwitch() {
		t.Fatalf("clear with an unremovable state file: err %v, engaged %v", err, h.g.KillSwitch())
	}
	var got []string
	for _, r := range adminRecords(t, h.dir) {
		got = append(got, r.Action)
	}
	if strings.Join(got, ",") != "kill_switch_on,kill_switch_off,kill_switch_on" {
		t.Fatalf("admin records: %v", got)
	}
	cs := h.connect("", nil)
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); wireCode(err) != CodeKillSwitch {
		t.Fatalf("call: %v", err)
	}
}

// syncSpy wraps the gateway's audit log and notes, in order, the kill
// switch records appended (with whether Append reported them durable) and
// each Checkpoint, with whether the kill switch's state file existed then.
type syncSpy struct {
	AuditLog
	state  string
	cpErr  error
	events []string
}

func (s *syncSpy) Append(ctx context.Context, rec record.Record) (auditlog.Receipt, error) {
	rc, err := s.AuditLog.Append(ctx, rec)
	if a, ok := rec.(*record.Admin); ok && err == nil {
		s.events = append(s.events, fmt.Sprintf("%s durable=%v", a.Action, rc.Durable))
	}
	return rc, err
}

func (s *syncSpy) Checkpoint() error {
	_, err := os.Stat(s.state)
	s.events = append(s.events, fmt.Sprintf("checkpoint file=%v", err == nil))
	if s.cpErr != nil {
		return s.cpErr
	}
	return s.AuditLog.Checkpoint()
}

// TestKillSwitchClearSyncsTheRecordBeforeRemovingTheFile: with
// audit.durability: interval, Append returns the kill_switch_off record
// before it is synced (Durable false), so clearing the switch checkpoints
// the log (which syncs every record appended so far) while the state file
// still exists, and removes the file only after that succeeded; when the
// checkpoint fails, the file stays and the switch stays engaged. What it
// proves is the order of the calls, not survival of a real power cut.
func TestKillSwitchClearSyncsTheRecordBeforeRemovingTheFile(t *testing.T) {
	h := newHarness(t, hconf{durability: record.DurabilityInterval})
	state := filepath.Join(t.TempDir(), KillSwitchStateFile)
	h.g.opts.KillSwitchFile = state
	spy := &syncSpy{AuditLog: h.g.log, state: state}
	h.g.log = spy
	ctx := context.Background()

	for _, cpErr := range []error{errors.New("disk gone"), nil} {
		spy.cpErr, spy.events = cpErr, nil
		if err := h.g.SetKillSwitch(ctx, true, "op", "incident"); err != nil {
			t.Fatal(err)
		}
		err := h.g.SetKillSwitch(ctx, false, "op", "resolved")
		_, serr := os.Stat(state)
		got := strings.Join(spy.events, ", ")
		if cpErr != nil {
			if err == nil || !strings.Contains(err.Error(), "stays engaged") || !h.g.KillSwitch() || serr != nil {
				t.Fatalf("clear with a failing checkpoint: err %v, engaged %v, state file %v (events: %s)", err, h.g.KillSwitch(), serr, got)
			}
			if want := "kill_switch_on durable=false, kill_switch_off durable=false, checkpoint file=true, kill_switch_on durable=false"; got != want {
				t.Fatalf("events:\n got %s\nwant %s", got, want)
			}
			continue
		}
		if err != nil || h.g.KillSwitch() || !errors.Is(serr, os.ErrNotExist) {
			t.Fatalf("clear: err %v, engaged %v, state file %v (events: %s)", err, h.g.KillSwitch(), serr, got)
		}
		if want := "kill_switch_on durable=false, kill_switch_off durable=false, checkpoint file=true"; got != want {
			t.Fatalf("events:\n got %s\nwant %s", got, want)
		}
	}
}

// TestKillSwitchStopsResourcesAndPrompts: the engaged kill switch refuses
// resources/read, resources/subscribe, prompts/get and completion/complete
// (-32064) through both fronts, as it does tools/call, even when the policy
// permits them: each refusal is an access record refused before the policy
// was asked (decision deny, mode none, the kill switch as the reason), and
// replay finds those records consistent. Cleared, they are allowed again.
func TestKillSwitchStopsResourcesAndPrompts(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			dir := policyBundle(t, toolsOnly+`
@id("reads")
permit (principal, action in [Action::"read_resource", Action::"get_prompt"], resource);
`)
			h := newHarness(t, hconf{policy: engine(t, dir, policy.Enforcing)})
			cs := h.connectVia(front, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			reads := []struct {
				method string
				do     func() error
			}{
				{"resources/read", func() error {
					_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"})
					return err
				}},
				{"resources/subscribe", func() error {
					return cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://static"})
				}},
				{"prompts/get", func() error {
					_, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "t__greet", Arguments: map[string]string{"who": "bob"}})
					return err
				}},
				{"completion/complete", func() error {
					_, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "t__greet"}, Argument: mcp.CompleteParamsArgument{Name: "who", Value: "b"}})
					return err
				}},
			}
			if err := h.g.SetKillSwitch(ctx, true, "test", "incident 42"); err != nil {
				t.Fatal(err)
			}
			for _, r := range reads {
				if err := r.do(); wireCode(err) != CodeKillSwitch || !strings.Contains(err.Error(), "kill switch is engaged") {
					t.Errorf("%s with the kill switch engaged: %v, want %d", r.method, err, CodeKillSwitch)
				}
			}
			if err := h.g.SetKillSwitch(ctx, false, "test", "resolved"); err != nil {
				t.Fatal(err)
			}
			for _, r := range reads {
				if err := r.do(); err != nil {
					t.Errorf("%s after clearing: %v", r.method, err)
				}
			}
			acc := kinds(h.records(), "access")
			if len(acc) != 2*len(reads) {
				t.Fatalf("%d access records, want %d: %v", len(acc), 2*len(reads), acc)
			}
			for i, r := range acc {
				b := r.Body
				if b["method"] != reads[i%len(reads)].method {
					t.Errorf("access record %d: method %v, want %s", i, b["method"], reads[i%len(reads)].method)
				}
				if i < len(reads) {
					if b["decision"] != "deny" || b["policy_mode"] != "none" || b["outcome"] != "refused" || b["policy_bundle"] != nil ||
						!strings.Contains(fmt.Sprint(b["reason"]), "kill switch is engaged") {
						t.Errorf("access record %d, refused by the kill switch: %v", i, b)
					}
				} else if b["decision"] != "allow" || b["outcome"] != "forwarded" {
					t.Errorf("access record %d, after clearing: %v", i, b)
				}
			}
			h.g.Shutdown(context.Background())
			h.w.Close()
			rep, err := replay.Run(context.Background(), h.dir, replay.Options{Policies: []string{dir}})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Summary.Accesses != 2*len(reads) || rep.Summary.Inconsistent != 0 || rep.Findings() {
				t.Fatalf("replay: %+v", rep.Summary)
			}
		})
	}
}

// TestKillSwitchBeatsAnAccessInProgress: reads racing the engaging of the
// kill switch are either recorded as forwarded before kill_switch_on or
// refused: no access record after kill_switch_on says "forwarded" (the
// switch is checked again, and the record appended, under the lock the
// switch changes under, as for calls).
// TestKillSwitchClearedOnlyOnceTheClearingIsDurable: in interval mode,
// where an append returns before its record is synced, the switch is
// cleared only once its kill_switch_off record is durable: a published
// (durable) checkpoint covers it when the clearing returns.
func TestKillSwitchClearedOnlyOnceTheClearingIsDurable(t *testing.T) {
	h := newHarness(t, hconf{durability: record.DurabilityInterval})
	ctx := context.Background()
	if err := h.g.SetKillSwitch(ctx, true, "test", "incident"); err != nil {
		t.Fatal(err)
	}
	if err := h.g.SetKillSwitch(ctx, false, "test", "resolved"); err != nil {
		t.Fatal(err)
	}
	cp, err := c2sp.ParseCheckpoint(h.w.LatestCheckpoint())
	if err != nil {
		t.Fatal(err)
	}
	off := int64(-1)
	for _, e := range logEntries(t, h.dir) {
		if r, ok := e.Rec.(*record.Admin); ok && r.Action == AdminKillSwitchOff {
			off = e.Index
		}
	}
	if off < 0 || cp.Size <= off {
		t.Fatalf("kill_switch_off is record %d, the durable checkpoint covers %d records: the switch was cleared before its clearing was durable", off, cp.Size)
	}
}

// TestKillSwitchBeatsAnAccessAlreadyDecided engages the kill switch while a
// read the policy permits is held between its decision and its forwarded
// record (in the decision's metrics count, which the test holds): the
// read is refused -32064 and no access record after kill_switch_on says
// forwarded. Deterministic, where TestKillSwitchBeatsAnAccessInProgress is a
// race.
func TestKillSwitchBeatsAnAccessAlreadyDecided(t *testing.T) {
	dir := policyBundle(t, toolsOnly+`
@id("reads")
permit (principal, action in [Action::"read_resource", Action::"get_prompt"], resource);
`)
	m := &heldDecisions{Registry: NewMetrics()}
	h := newHarness(t, hconf{policy: engine(t, dir, policy.Enforcing), metrics: m})
	cs := h.connect("", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"}); err != nil {
		t.Fatalf("a read before the kill switch: %v", err)
	}
	m.held.Lock() // the next read waits after its decision, before its record
	errc := make(chan error, 1)
	go func() {
		_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"})
		errc <- err
	}()
	gwtest.WaitGoroutine(t, "sync.Mutex.Lock", "gateway.(*heldDecisions).Decision(") // the read is decided
	if err := h.g.SetKillSwitch(ctx, true, "test", "incident"); err != nil {
		m.held.Unlock()
		t.Fatal(err)
	}
	m.held.Unlock()
	if err := <-errc; wireCode(err) != CodeKillSwitch {
		t.Fatalf("the read decided before the kill switch got %v, want %d", err, CodeKillSwitch)
	}
	killed, refused := accessesAfterKill(t, h.dir)
	if !killed || refused != 1 {
		t.Fatalf("kill_switch_on recorded: %v; %d refused access records after it, want 1", killed, refused)
	}
}

func TestKillSwitchBeatsAnAccessInProgress(t *testing.T) {
	h := newHarness(t, hconf{durability: record.DurabilityStrict})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const agents = 6
	done := make(chan error, agents)
	for range agents {
		cs := h.connect("", nil)
		go func() {
			for ctx.Err() == nil {
				_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://static"})
				if wireCode(err) == CodeKillSwitch {
					done <- nil
					return
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- ctx.Err()
		}()
	}
	eventually(t, 20*time.Second, func() string {
		if n := len(kinds(h.records(), "access")); n < 4*agents {
			return fmt.Sprintf("%d reads recorded", n)
		}
		return ""
	})
	if err := h.g.SetKillSwitch(ctx, true, "test", "incident"); err != nil {
		t.Fatal(err)
	}
	for range agents {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	_, refused := accessesAfterKill(t, h.dir)
	if refused < agents {
		t.Fatalf("%d refused access records after kill_switch_on, want %d at least", refused, agents)
	}
}

// accessesAfterKill reads the log in dir: whether kill_switch_on is in it,
// and how many access records follow it, failing the test on one that says
// forwarded.
func accessesAfterKill(t *testing.T, dir string) (killed bool, refused int) {
	t.Helper()
	for _, e := range logEntries(t, dir) {
		switch r := e.Rec.(type) {
		case *record.Admin:
			killed = killed || r.Action == "kill_switch_on"
		case *record.Access:
			if killed && r.Outcome == record.OutcomeForwarded {
				t.Fatalf("access record %d after kill_switch_on says forwarded", e.Index)
			}
			if killed {
				refused++
			}
		}
	}
	return killed, refused
}

// heldDecisions counts into a metrics registry, but Decision waits while
// held is locked: a call or read waits there, after its decision and
// before its record.
type heldDecisions struct {
	*metrics.Registry
	held sync.Mutex
}

func (m *heldDecisions) Decision(decision, mode string) {
	m.held.Lock()
	//lint:ignore SA2001 an empty critical section: it only waits while the test holds the lock
	m.held.Unlock()
	m.Registry.Decision(decision, mode)
}
