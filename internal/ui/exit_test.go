package ui_test

import (
	"testing"

	"github.com/confidential-mcp/cmcp/internal/ui"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// Every verification failure class of pkg/auditlog has its own documented
// exit code; a class the map does not know would fall back to 1.
func TestLogFailureCodeCoversEveryClass(t *testing.T) {
	want := map[auditlog.Class]int{
		auditlog.ClassIntegrity:  ui.ExitLogInteg,
		auditlog.ClassSignature:  ui.ExitLogSig,
		auditlog.ClassKey:        ui.ExitLogKey,
		auditlog.ClassTruncation: ui.ExitLogTrunc,
		auditlog.ClassFork:       ui.ExitLogFork,
		auditlog.ClassIO:         ui.ExitIO,
		auditlog.ClassNotLog:     ui.ExitUsage,
		auditlog.ClassUsage:      ui.ExitUsage,
	}
	for class, code := range want {
		if got := ui.LogFailureCode(string(class)); got != code {
			t.Errorf("LogFailureCode(%q) = %d, want %d", class, got, code)
		}
	}
	if got := ui.LogFailureCode("no-such-class"); got != ui.ExitFailure {
		t.Errorf("unknown class gave %d, want %d", got, ui.ExitFailure)
	}
}
