package cli

import (
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

// TestVerifyChainEpochFlag: --epoch is checked like --prove. Before, -1 became
// the path "epoch--00001" (exit 3, "no such file"), a missing epoch was an
// I/O error, and --epoch without --prove was silently ignored.
func TestVerifyChainEpochFlag(t *testing.T) {
	l, _ := base(t)
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"negative", []string{"--epoch", "-1", "--prove", "1"}, exitcode.ExitUsage, "epochs are numbered from 1"},
		{"zero", []string{"--epoch", "0", "--prove", "1"}, exitcode.ExitUsage, "epochs are numbered from 1"},
		{"absent epoch", []string{"--epoch", "9", "--prove", "1"}, exitcode.ExitUsage, "has epochs 1-1; there is no epoch 9"},
		{"without --prove", []string{"--epoch", "1"}, exitcode.ExitUsage, "give --prove N with it"},
		{"good", []string{"--epoch", "1", "--prove", "1"}, exitcode.ExitOK, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, append([]string{"verify-chain", l.dir, "--key", l.vkey}, c.args...)...)
			if code != c.code || !strings.Contains(errOut, c.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s%s", code, c.code, c.want, out, errOut)
			}
		})
	}
}
