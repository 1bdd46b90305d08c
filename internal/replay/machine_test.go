package replay

import (
	"context"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestReplayChecksCallsWentToRegisteredMachines: replay reads machine
// records; a forwarded call naming a tunnel machine that no machine record
// of its epoch registered before it is a warning naming the record, and
// calls to a registered machine are not. A log with no machine records (an
// older gateway's) is not checked.
func TestReplayChecksCallsWentToRegisteredMachines(t *testing.T) {
	_, id := newKeys(t)
	machineOf := map[int]string{} // call i -> machine, for the forwarded ones
	spec := func(register bool) logSpec {
		return logSpec{
			before: func(w *auditlog.Writer, i int) {
				if i == 0 && register {
					if _, err := w.Append(context.Background(), &record.Machine{Event: record.MachineRegistered, Upstream: "fs", Machine: "lab-1", TokenID: "tokens[0]", Class: "tunnel"}); err != nil {
						t.Fatal(err)
					}
				}
			},
			mut: func(i int, rec *record.Call) bool {
				if rec.Outcome == record.OutcomeForwarded && rec.Upstream == "fs" {
					rec.Machine = "lab-1"
					if len(machineOf) == 1 {
						rec.Machine = "lab-9" // the second forwarded call: never registered
					}
					machineOf[i] = rec.Machine
				}
				return rec.Outcome == record.OutcomeForwarded
			},
		}
	}
	dir, idx := writeLogWith(t, id, spec(true))
	if len(machineOf) < 2 {
		t.Fatalf("the log has %d forwarded fs calls, want 2 or more", len(machineOf))
	}
	rep, err := Run(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var warn string
	for _, w := range rep.Warnings {
		if strings.Contains(w, "no machine record") {
			warn = w
		}
	}
	if warn == "" || !strings.Contains(warn, "fs/lab-9") || strings.Contains(warn, "fs/lab-1") || !strings.Contains(warn, ": 1 (") {
		t.Fatalf("warning %q, want one naming fs/lab-9 (calls at %v)", warn, idx)
	}
	clear(machineOf)
	dir, _ = writeLogWith(t, id, spec(false))
	rep, err = Run(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range rep.Warnings {
		if strings.Contains(w, "no machine record") {
			t.Fatalf("a log without machine records: %q", w)
		}
	}
}
