package pid1

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/proctest"
)

// The test binary is the program when PID1_TEST is set: Run first (as
// cli.Main calls it), then what the mode says.
func TestMain(m *testing.M) {
	mode := os.Getenv("PID1_TEST")
	if mode == "" {
		os.Exit(m.Run())
	}
	if code, done := Run(os.Stderr); done {
		os.Exit(code)
	}
	os.Exit(program(mode))
}

func program(mode string) int {
	switch mode {
	case "exit7":
		return 7
	case "kill":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
	case "echo": // stdin to stdout, as `serve --stdio` uses them
		var b bytes.Buffer
		b.ReadFrom(os.Stdin)
		os.Stdout.Write(b.Bytes())
		return 0
	case "orphans":
		// Grandchildren whose parent exits at once: they are orphans of
		// process 1 and end while it runs; some end by themselves, some are
		// killed as a stopped child's group is.
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		for range 3 {
			if err := self("fork").Run(); err != nil {
				return 10
			}
		}
		os.Stdout.WriteString("ready\n")
		<-term
		os.Stdout.WriteString("term\n")
		return 3
	case "fork": // start two grandchildren, do not wait
		quick, slow := self("sleep"), self("sleep")
		quick.Args = append(quick.Args, "100ms")
		slow.Args = append(slow.Args, "1h")
		quick.Start()
		slow.Start()
		go func() { time.Sleep(200 * time.Millisecond); slow.Process.Kill() }()
		time.Sleep(300 * time.Millisecond)
		return 0
	case "sleep":
		d, _ := time.ParseDuration(os.Args[len(os.Args)-1])
		time.Sleep(d)
		return 0
	}
	return 99
}

func self(mode string) *exec.Cmd {
	c := exec.Command("/proc/self/exe", "pid1-test")
	c.Env = append(os.Environ(), "PID1_TEST="+mode)
	return c
}

// underInit starts the test binary as process 1 of a new PID namespace.
func underInit(t *testing.T, mode string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare(1) is not installed: cannot run a process as PID 1")
	}
	if out, err := exec.Command("unshare", "-fp", "--kill-child", "true").CombinedOutput(); err != nil {
		t.Skipf("cannot make a PID namespace here (unshare -fp: %v %s): needs root or CAP_SYS_ADMIN", err, bytes.TrimSpace(out))
	}
	c := exec.Command("unshare", "-fp", "--kill-child", os.Args[0])
	c.Env = append(os.Environ(), "PID1_TEST="+mode)
	return c
}

// TestInitReapsOrphans: run as process 1 (a container without --init), the
// program's orphaned grandchildren, whether they end by themselves or are
// killed, are reaped, and SIGTERM sent to process 1 reaches the program,
// whose exit status process 1 exits with. Without Run the program is
// process 1 and its grandchildren stay zombies of it.
func TestInitReapsOrphans(t *testing.T) {
	c := underInit(t, "orphans")
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer c.Process.Kill()
	r := bufio.NewReader(out)
	if line, err := r.ReadString('\n'); line != "ready\n" {
		t.Fatalf("program: %q %v; stderr:\n%s", line, err, stderr.String())
	}
	init := proctest.ChildOf(t, c.Process.Pid)
	// Wait for the event, not a delay: every orphan has ended and been
	// reaped once process 1's only child is the program (on a loaded
	// machine a grandchild may end well after "ready").
	deadline := time.Now().Add(30 * time.Second)
	for {
		var kids, zombies []proctest.Proc
		for _, p := range proctest.List(t) {
			if p.PPID == init {
				kids = append(kids, p)
				if p.State == "Z" {
					zombies = append(zombies, p)
				}
			}
		}
		if len(kids) == 1 && len(zombies) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombies left with process 1 (host pid %d) as parent: %v (its children: %v)", init, zombies, kids)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(init, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); line != "term\n" {
		t.Fatalf("the program after SIGTERM to process 1: %q %v", line, err)
	}
	err = c.Wait()
	if c.ProcessState.ExitCode() != 3 {
		t.Fatalf("exit: %v, want status 3, the program's", err)
	}
	if n := strings.Count(stderr.String(), "cmcp: running as PID 1"); n != 1 {
		t.Fatalf("stderr says %d times that cmcp acts as init, want once:\n%s", n, stderr.String())
	}
}

// TestInitExitStatus: process 1 exits with the program's status, 128+n when
// signal n ended it; stdin and stdout are the program's, process 1 writes
// nothing to stdout.
func TestInitExitStatus(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want int
	}{
		{"exit7", 7},
		{"kill", 128 + 9},
		{"echo", 0},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			c := underInit(t, tc.mode)
			in := "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n"
			c.Stdin = strings.NewReader(in)
			var stdout, stderr bytes.Buffer
			c.Stdout, c.Stderr = &stdout, &stderr
			err := c.Run()
			if got := c.ProcessState.ExitCode(); got != tc.want {
				t.Fatalf("exit %d (%v), want %d; stderr:\n%s", got, err, tc.want, stderr.String())
			}
			want := ""
			if tc.mode == "echo" {
				want = in
			}
			if stdout.String() != want {
				t.Fatalf("stdout %q, want %q", stdout.String(), want)
			}
		})
	}
}
