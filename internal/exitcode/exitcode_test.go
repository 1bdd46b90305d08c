package exitcode_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// Every verification failure class of pkg/auditlog has its own documented
// exit code; a class the map does not know would fall back to 1.
func TestLogFailureCodeCoversEveryClass(t *testing.T) {
	want := map[record.Class]int{
		record.ClassIntegrity:  exitcode.ExitLogInteg,
		record.ClassSignature:  exitcode.ExitLogSig,
		record.ClassKey:        exitcode.ExitLogKey,
		record.ClassTruncation: exitcode.ExitLogTrunc,
		record.ClassFork:       exitcode.ExitLogFork,
		record.ClassIO:         exitcode.ExitIO,
		record.ClassNotLog:     exitcode.ExitUsage,
		record.ClassUsage:      exitcode.ExitUsage,
	}
	for class, code := range want {
		if got := exitcode.LogFailureCode(string(class)); got != code {
			t.Errorf("LogFailureCode(%q) = %d, want %d", class, got, code)
		}
	}
	if got := exitcode.LogFailureCode("no-such-class"); got != exitcode.ExitFailure {
		t.Errorf("unknown class gave %d, want %d", got, exitcode.ExitFailure)
	}
}

type coded struct{}

func (coded) Error() string   { return "coded" }
func (coded) ExitCode() int   { return exitcode.ExitLogFork }
func (coded) Hints() []string { return []string{"from the library"} }

func TestCodesAndHints(t *testing.T) {
	if exitcode.CodeOf(nil) != exitcode.ExitOK || exitcode.CodeOf(errors.New("x")) != exitcode.ExitFailure {
		t.Fatal("nil must be 0 and an uncoded error 1")
	}
	err := fmt.Errorf("open log: %w", exitcode.Errorf(exitcode.ExitIO, "read: %w", coded{}).Hint("check the path"))
	if exitcode.CodeOf(err) != exitcode.ExitIO {
		t.Fatalf("outermost *Error must decide the code, got %d", exitcode.CodeOf(err))
	}
	if h := exitcode.HintsOf(err); len(h) != 2 || h[0] != "check the path" || h[1] != "from the library" {
		t.Fatalf("hints = %q", h)
	}
	if exitcode.CodeOf(fmt.Errorf("wrapped: %w", coded{})) != exitcode.ExitLogFork {
		t.Fatal("a Coder in the chain must give its code")
	}
	seen := map[int]bool{}
	for _, c := range exitcode.ExitCodes {
		if seen[c.Code] {
			t.Fatalf("exit code %d listed twice", c.Code)
		}
		seen[c.Code] = true
	}
}
