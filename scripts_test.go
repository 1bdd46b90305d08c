package cmcp_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestTestScriptChecksItsToolsFirst: scripts/test.sh, run where npm and the
// C compiler are missing, says so for each before any step runs (no
// gofmt, no downloads), and fails. A missing C compiler used to show only
// at the last step, as go test -race's cgo error.
func TestTestScriptChecksItsToolsFirst(t *testing.T) {
	bin := t.TempDir()
	for _, tool := range []string{"bash", "dirname", "sed", "go", "gofmt", "git", "curl", "flock"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("needs %s: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(bin, "bash"), "scripts/test.sh")
	env := []string{"PATH=" + bin}
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); name != "PATH" && name != "CC" && name != "CGO_ENABLED" {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "CC=cmcp-test-no-such-cc")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("scripts/test.sh passed without npm and a C compiler:\n%s", out)
	}
	for _, want := range []string{
		"test.sh: npm not found: scripts/peers.sh installs Node 22",
		"test.sh: C compiler cmcp-test-no-such-cc not found: go test -race needs cgo",
		"test.sh: nothing was run",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("scripts/test.sh does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "==") {
		t.Errorf("scripts/test.sh ran a step before saying what is missing:\n%s", out)
	}
}

// TestReadmeNamesTheGoVersion: the Go version README.md asks for is
// go.mod's.
func TestReadmeNamesTheGoVersion(t *testing.T) {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "Go " + string(m[1]) + " or newer (`go.mod`)"; !strings.Contains(string(readme), want) {
		t.Errorf("README.md does not say %q", want)
	}
}

// TestMutateScript: scripts/mutate.sh, the mutation check of
// docs/CLAIMS.md, exits 0 when the mutant fails the tests, 1 when it passes
// them, and leaves the file as it was either way.
func TestMutateScript(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test twice")
	}
	const file = "internal/exitcode/exitcode.go"
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		old, new string
		code     int
	}{
		{"case \"fork\":\n\t\treturn ExitLogFork", "case \"fork\":\n\t\treturn ExitLogTrunc", 0}, // caught
		{"// success", "// succeeded", 1}, // a comment: not caught
		{"no such text", "x", 2},
	} {
		cmd := exec.Command("bash", "scripts/mutate.sh", file, c.old, c.new, "-run", "TestLogFailureCodeCoversEveryClass", "./internal/exitcode")
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code {
			t.Errorf("mutate.sh %q -> %q: exit %d, want %d\n%s", c.old, c.new, code, c.code, out)
		}
		if after, err := os.ReadFile(file); err != nil || string(after) != string(before) {
			t.Fatalf("mutate.sh %q left %s changed (%v)", c.old, file, err)
		}
	}
}

// TestTestSummary: scripts/testsummary.go, which ends scripts/test.sh,
// prints a failed test's output and the package lines, and ends with
// "N passed, N failed" counting top-level tests (a package that failed
// outside its tests counts once), exiting 1 when anything failed.
func TestTestSummary(t *testing.T) {
	events := `{"Action":"start","Package":"a"}
{"Action":"run","Package":"a","Test":"TestOK"}
{"Action":"output","Package":"a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"a","Test":"TestOK","Output":"    quiet log\n"}
{"Action":"pass","Package":"a","Test":"TestOK"}
{"Action":"run","Package":"a","Test":"TestBad"}
{"Action":"output","Package":"a","Test":"TestBad/sub","Output":"    sub broke\n"}
{"Action":"fail","Package":"a","Test":"TestBad/sub"}
{"Action":"output","Package":"a","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"a","Test":"TestBad"}
{"Action":"output","Package":"a","Output":"FAIL\ta\t0.1s\n"}
{"Action":"fail","Package":"a"}
{"Action":"output","Package":"b","Output":"FAIL\tb [build failed]\n"}
{"Action":"fail","Package":"b"}
`
	cmd := exec.Command("go", "run", "scripts/testsummary.go")
	cmd.Stdin = strings.NewReader(events)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("testsummary: %v, want exit 1\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{"    sub broke\n", "--- FAIL: TestBad", "FAIL\ta\t0.1s\n", "FAIL\tb [build failed]\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("testsummary does not print %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet log") || strings.Contains(got, "=== RUN") {
		t.Errorf("testsummary prints a passing test's output:\n%s", got)
	}
	if !strings.HasSuffix(got, "\n1 passed, 2 failed\n") {
		t.Errorf("testsummary does not end with \"1 passed, 2 failed\":\n%s", got)
	}
}
