package stdiofront

import (
	"io"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// blockingPipe is a pipe whose ends are blocking, as an agent's stdin and
// stdout are (os.Pipe's are not).
func blockingPipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(p[0]), "r"), os.NewFile(uintptr(p[1]), "w")
}

func nonblocking(t *testing.T, f *os.File) bool {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fl int
	if err := rc.Control(func(fd uintptr) { fl, err = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return fl&unix.O_NONBLOCK != 0
}

// TestPollableLeavesTheSharedEndBlocking: the agent's ends of its pipes
// are opened again, non-blocking, for the poller; the descriptions the
// agent (or a shell) shares stay blocking; lines pass both ways, and
// closing the connection's ends closes both descriptions, so that the
// agent sees the end of cmcp's output.
func TestPollableLeavesTheSharedEndBlocking(t *testing.T) {
	inR, inW := blockingPipe(t)
	outR, outW := blockingPipe(t)
	defer inW.Close()
	defer outR.Close()
	in, out := pollableReader(inR), pollableWriter(outW)
	for _, f := range []any{in, out} {
		r, ok := f.(*reopened)
		if !ok {
			t.Fatalf("%T: a blocking pipe was not opened again", f)
		}
		if !nonblocking(t, r.File) {
			t.Fatal("the reopened end is blocking")
		}
		if nonblocking(t, r.orig) {
			t.Fatal("the shared description was made non-blocking")
		}
	}
	if _, err := inW.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(in, buf); err != nil || string(buf) != "ping\n" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if _, err := out.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(outR, buf); err != nil || string(buf) != "pong\n" {
		t.Fatalf("agent read %q, %v", buf, err)
	}
	in.Close()
	out.Close()
	if n, err := outR.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after Close the agent read %d bytes, %v; want EOF", n, err)
	}
	if _, err := inW.Write([]byte("x\n")); err == nil {
		t.Fatal("the agent could still write to cmcp's input after Close")
	}
	// Not a pipe: left as it is.
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := pollableReader(f); got != io.ReadCloser(f) {
		t.Fatalf("%s was replaced by %T", os.DevNull, got)
	}
}
