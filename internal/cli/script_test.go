package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
)

// TestMain lets the test binary act as the cmcp binary when it is run as
// "cmcp-bin": scripts use `exec cmcp-bin ...` for a real child process (for
// example a server in the background with &), and `cmcp ...` to run
// cli.Main in-process.
//
// With CMCP_CLI_CHILD=1 the test binary is cmcp whatever its name (for
// tests that start os.Args[0] as a child).
func TestMain(m *testing.M) {
	if os.Getenv("CMCP_CLI_CHILD") == "1" {
		os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	if mode := os.Getenv("CMCP_TEST_FORKER"); mode != "" {
		os.Exit(forker(mode)) // an upstream of serve_pid1_test.go
	}
	testscript.Main(cleanupM{m}, map[string]func(){
		"cmcp-bin": func() { os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) },
	})
}

// cleanupM removes what the package's tests left behind after they ran
// (testscript.Main exits the process itself).
type cleanupM struct{ m *testing.M }

func (c cleanupM) Run() int {
	code := c.m.Run()
	schemaFailuresMu.Lock()
	defer schemaFailuresMu.Unlock()
	for _, f := range schemaFailures {
		fmt.Fprintf(os.Stderr, "FAIL: output that does not match its schema: %s\n", f)
		code = 1
	}
	return code
}

// TestScripts runs testdata/script/*.txtar. Commands added to testscript:
//
//	cmcp ARGS...          run cli.Main in-process in the script's directory
//	                      and environment; with !, expect a non-zero exit
//	exitcode N            the last cmcp (or asnobody) exit code was N
//	asnobody cmcp ARGS... as cmcp, but as user nobody (uid 65534) when the
//	                      test runs as root, so that file permissions apply
//	mkfifo PATH...        create FIFOs
//
// Conditions: [root] is true when the test runs as root.
func TestScripts(t *testing.T) {
	// Absolute: the in-process cmcp command changes the working directory
	// while other scripts start.
	dir, err := filepath.Abs(filepath.Join("..", "..", "testdata", "script"))
	if err != nil {
		t.Fatal(err)
	}
	nobodyOnce, nobodyBin, nobodyErr = sync.Once{}, "", nil // for -count > 1
	t.Cleanup(func() {
		if nobodyBin != "" {
			os.RemoveAll(filepath.Dir(nobodyBin))
		}
	})
	testscript.Run(t, testscript.Params{
		Dir:                 dir,
		RequireExplicitExec: true,
		Setup: func(env *testscript.Env) error {
			env.Setenv("NO_COLOR", "1")
			// $TESTDATA: the repository's testdata (binary vectors such as evidence).
			env.Setenv("TESTDATA", filepath.Dir(dir))
			return nil
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "root":
				return os.Geteuid() == 0, nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"cmcp":     cmdCmcp,
			"exitcode": cmdExitcode,
			"asnobody": cmdAsNobody,
			"mkfifo": func(ts *testscript.TestScript, neg bool, args []string) {
				for _, a := range args {
					ts.Check(syscall.Mkfifo(ts.MkAbs(a), 0o644))
				}
			},
		},
	})
}

// cwdMu serialises the in-process runs: cli.Main resolves relative paths
// against the process's working directory, which is shared.
var cwdMu sync.Mutex

func cmdCmcp(ts *testscript.TestScript, neg bool, args []string) {
	cwdMu.Lock()
	old, err := os.Getwd()
	ts.Check(err)
	ts.Check(os.Chdir(ts.MkAbs(".")))
	var out bytes.Buffer
	code := mainWithEnv(args, strings.NewReader(""), io.MultiWriter(ts.Stdout(), &out), ts.Stderr(), scriptEnviron(ts))
	ts.Check(os.Chdir(old))
	cwdMu.Unlock()
	// What the verbs print and write must match docs/schema.
	ts.Check(checkJSONOutput(args, out.Bytes()))
	ts.Check(checkWrittenFiles(args, ts.MkAbs("."), code))
	checkExit(ts, neg, code)
}

func checkExit(ts *testscript.TestScript, neg bool, code int) {
	ts.Setenv("CMCP_EXIT", strconv.Itoa(code))
	switch {
	case neg && code == 0:
		ts.Fatalf("cmcp succeeded, want a failure")
	case !neg && code != 0:
		ts.Fatalf("cmcp exited %d", code)
	}
}

func cmdExitcode(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: exitcode N")
	}
	if got := ts.Getenv("CMCP_EXIT"); (got == args[0]) == neg {
		ts.Fatalf("exit code %s, want %s%s", got, map[bool]string{true: "not ", false: ""}[neg], args[0])
	}
}

// scriptEnviron is the script's environment. testscript does not export
// it; read the unexported field, falling back to the usual variables.
func scriptEnviron(ts *testscript.TestScript) []string {
	if f := reflect.ValueOf(ts).Elem().FieldByName("env"); f.IsValid() && f.Kind() == reflect.Slice {
		out := make([]string, f.Len())
		for i := range out {
			out[i] = f.Index(i).String()
		}
		return out
	}
	var out []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "WORK", "NO_COLOR", "TERM"} {
		out = append(out, k+"="+ts.Getenv(k))
	}
	return out
}

var (
	nobodyOnce sync.Once
	nobodyBin  string
	nobodyErr  error
)

// cmdAsNobody runs cmcp as uid/gid 65534 when the test runs as root (root
// reads any file, so permission errors could not be tested otherwise), and
// in-process otherwise.
func cmdAsNobody(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) == 0 || args[0] != "cmcp" {
		ts.Fatalf("usage: asnobody cmcp ARGS...")
	}
	if os.Geteuid() != 0 {
		cmdCmcp(ts, neg, args[1:])
		return
	}
	nobodyOnce.Do(func() {
		// A copy of the test binary that nobody can execute, named so that
		// TestMain runs cli.Main.
		dir, err := os.MkdirTemp("", "cmcp-nobody-")
		if err != nil {
			nobodyErr = err
			return
		}
		os.Chmod(dir, 0o755)
		self, err := os.Executable()
		if err != nil {
			nobodyErr = err
			return
		}
		nobodyBin = filepath.Join(dir, "cmcp-bin")
		nobodyErr = copyExecutable(self, nobodyBin)
	})
	ts.Check(nobodyErr)
	// nobody must be able to reach the script's directory.
	for d := ts.MkAbs("."); d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil {
			os.Chmod(d, fi.Mode().Perm()|0o011)
		}
	}
	var err error
	for try := 0; ; try++ {
		cmd := exec.Command(nobodyBin, args[1:]...)
		cmd.Dir = ts.MkAbs(".")
		cmd.Env = scriptEnviron(ts)
		cmd.Stdout, cmd.Stderr = ts.Stdout(), ts.Stderr()
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		err = cmd.Run()
		// A child forked elsewhere while the copy was open for writing
		// may still hold it: ETXTBSY until that child execs. Try again.
		if !errors.Is(err, syscall.ETXTBSY) || try == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		ts.Check(err)
	}
	checkExit(ts, neg, code)
}

func copyExecutable(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
