package pid1

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// forwarded are the signals process 1 passes on to the program. The
// program's own children run in their own process groups and are stopped by
// the program, so the signal goes to the program only.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// Run acts as init when the process is process 1 and not already the
// program that an init started. It returns done false when the caller is to
// go on as the program: not process 1, the program itself (ChildEnv set;
// Run removes it), or cmcp could not be started again (a warning on stderr
// says so). Otherwise it returns once the program has ended, with the exit
// code to end with.
func Run(stderr io.Writer) (code int, done bool) {
	if _, set := os.LookupEnv(ChildEnv); set {
		os.Unsetenv(ChildEnv)
		return 0, false
	}
	if os.Getpid() != 1 {
		return 0, false
	}
	// Catch the signals before the program starts, so that none sent in
	// between is lost. SIGPIPE is caught and dropped: a closed stderr must
	// not end process 1 (and with it the namespace). Caught, not ignored:
	// an ignored signal would stay ignored in the program.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	fmt.Fprintln(stderr, "cmcp: running as PID 1: acting as init for itself (starts cmcp again as its child, forwards signals to it, reaps orphaned processes); --init is not needed")
	p, err := os.StartProcess("/proc/self/exe", os.Args, &os.ProcAttr{
		Env:   append(os.Environ(), ChildEnv+"=1"),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	if err != nil {
		signal.Reset(forwarded...)
		fmt.Fprintf(stderr, "cmcp: warning: cannot start cmcp again as the child of its init (/proc/self/exe: %v): running as PID 1 without reaping orphaned processes; run the container with --init\n", err)
		return 0, false
	}
	dropStreams()
	return supervise(p, sigs), true
}

// dropStreams points process 1's own stdin and stdout at /dev/null once the
// program has them: the agent of `serve --stdio` then sees the end of the
// gateway's output when the gateway closes it, not when process 1 exits.
func dropStreams() {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer null.Close()
	_ = syscall.Dup3(int(null.Fd()), 0, 0)
	_ = syscall.Dup3(int(null.Fd()), 1, 0)
}

// supervise forwards sigs to p and reaps every child of the process until
// p has ended, and returns p's exit code.
func supervise(p *os.Process, sigs <-chan os.Signal) int {
	ended := make(chan syscall.WaitStatus, 1)
	go func() {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, 0, nil)
			switch {
			case err == syscall.EINTR:
				continue
			case err != nil:
				// ECHILD: nothing left to wait for, p included (which
				// cannot be while p runs).
				ended <- syscall.WaitStatus(1 << 8)
				return
			case pid == p.Pid:
				ended <- ws
				return
			}
		}
	}()
	for {
		select {
		case s := <-sigs:
			// By pidfd: a signal that comes after p was reaped reaches
			// no other process that got its pid.
			_ = p.Signal(s)
		case ws := <-ended:
			return exitCode(ws)
		}
	}
}

// exitCode is the status a shell gives a process that ended with ws.
func exitCode(ws syscall.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return 1
}
