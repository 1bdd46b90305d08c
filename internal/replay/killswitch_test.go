package replay

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestReplayFindsACallForwardedWhileKilled: the gateway writes no
// forwarded call or access record between kill_switch_on and
// kill_switch_off (Gateway.SetKillSwitch, claim killswitch-refuses-access). A log written with
// its key in which calls are forwarded while the switch is engaged has each
// of them inconsistent (exit 30), with --policy and without; calls after
// kill_switch_off are not. Before, replay did not read admin records at
// all.
func TestReplayFindsACallForwardedWhileKilled(t *testing.T) {
	_, id := newKeys(t)
	admin := func(w *auditlog.Writer, action string) int64 {
		rc, err := w.Append(context.Background(), &record.Admin{Action: action, Actor: "admin-token@127.0.0.1", Reason: "incident"})
		if err != nil {
			t.Fatal(err)
		}
		return rc.Index
	}
	var on int64
	dir, _ := writeLogWith(t, id, logSpec{before: func(w *auditlog.Writer, i int) {
		switch i {
		case 2:
			on = admin(w, "kill_switch_on")
		case 4:
			admin(w, "kill_switch_off")
		}
	}})
	for name, opts := range map[string]Options{"--policy": {Policies: []string{"testdata/recorded"}, Identities: []age.Identity{id}}, "no --policy": {}} {
		rep, err := Run(context.Background(), dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("forwarded while the kill switch was engaged (kill_switch_on, record %d)", on)
		for i, c := range rep.Calls {
			killed := (i == 2 || i == 3) && c.Outcome == record.OutcomeForwarded
			if got := strings.Contains(c.Inconsistent, want); got != killed {
				t.Errorf("%s: call %d (%s): inconsistent %q", name, i, c.Outcome, c.Inconsistent)
			}
		}
		if !rep.Findings() || rep.Summary.Inconsistent != 2 {
			t.Errorf("%s: summary %+v", name, rep.Summary)
		}
	}
}
