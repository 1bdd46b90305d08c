package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

// TestHugeInputsAreRefused: every file read whole for a flag or an argument
// is bounded. Before, a device such as /dev/zero made cmcp read until memory
// ran out, and a huge file was read whole before being judged.
func TestHugeInputsAreRefused(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	// Sparse: no disk used, reads as zeros.
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, maxInputFile+1); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join("..", "..", "testdata", "evidence", "snp-milan-v2-report.bin")
	l, _ := base(t)
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bundle", []string{"attest", "verify", big}, exitcode.ExitIO, "larger than 64 MiB"},
		{"raw report", []string{"attest", "verify", "--raw-report", big}, exitcode.ExitIO, "--raw-report: read " + big + ": larger than 64 MiB"},
		{"certificate", []string{"attest", "verify", "--raw-report", report, "--cert", big}, exitcode.ExitIO, "--cert: read " + big + ": larger than"},
		{"roots", []string{"attest", "verify", "--raw-report", report, "--roots", big}, exitcode.ExitIO, "--roots: read " + big},
		{"reference", []string{"attest", "verify", "--raw-report", report, "--reference", big}, exitcode.ExitUsage, "not reference values: larger than"},
		{"nonce file", []string{"attest", "--provider", "software", "--nonce-file", big, "--key-out", filepath.Join(dir, "k.pem"), "--out", filepath.Join(dir, "e.json")}, exitcode.ExitIO, "--nonce-file: read " + big},
		{"proof", []string{"verify-chain", "--proof", big, "--key", l.vkey}, exitcode.ExitIO, "--proof: read " + big},
		{"checkpoint", []string{"verify-chain", l.dir, "--key", l.vkey, "--checkpoint", big}, exitcode.ExitIO, "--checkpoint: read " + big},
	}
	if fi, err := os.Stat("/dev/zero"); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		cases = append(cases, struct {
			name string
			args []string
			code int
			want string
		}{"endless device", []string{"attest", "verify", "--raw-report", "/dev/zero"}, exitcode.ExitIO, "read /dev/zero: larger than 64 MiB"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, c.args...)
			if code != c.code || !strings.Contains(errOut, c.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, c.code, c.want, errOut)
			}
		})
	}
}
