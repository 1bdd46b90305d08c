package stdiofront

import (
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// pollable returns f, an end of a pipe (a stdio agent's stdin or stdout),
// opened again as an open file description of its own in non-blocking
// mode, so that Go's poller waits for it: the goroutine reading the agent's
// next line waits parked, not in a read(2) that holds a thread and keeps
// the runtime's monitor polling every 20 µs to take that thread's P back
// (a third of serve --stdio's CPU per call). The description f shares with
// the agent, or with a shell, stays blocking. Anything other than a pipe
// (a file, a terminal, a socket), or a pipe that cannot be opened again
// (no /proc), is returned as it is, with ok false.
func pollable(f *os.File, flag int) (_ *os.File, ok bool) {
	rc, err := f.SyscallConn()
	if err != nil {
		return f, false
	}
	nfd := -1
	_ = rc.Control(func(fd uintptr) {
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return
		}
		if fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK != 0 {
			return // already pollable, or not knowable: left alone
		}
		nfd, err = unix.Open("/proc/self/fd/"+strconv.Itoa(int(fd)), flag|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			nfd = -1
		}
	})
	if nfd < 0 {
		return f, false
	}
	return os.NewFile(uintptr(nfd), f.Name()), true
}

// pollableReader is In reopened by pollable, if it could be: closing it
// closes both descriptions.
func pollableReader(in io.ReadCloser) io.ReadCloser {
	if r := reopen(in, unix.O_RDONLY); r != nil {
		return r
	}
	return in
}

// pollableWriter is Out reopened by pollable, if it could be: the agent
// sees the end of cmcp's output once both descriptions are closed.
func pollableWriter(out io.WriteCloser) io.WriteCloser {
	if r := reopen(out, unix.O_WRONLY); r != nil {
		return r
	}
	return out
}

// reopen is f reopened by pollable with the access mode given, or nil when
// f is not a file pollable reopens.
func reopen(f any, mode int) *reopened {
	orig, ok := f.(*os.File)
	if !ok {
		return nil
	}
	p, ok := pollable(orig, mode)
	if !ok {
		return nil
	}
	return &reopened{File: p, orig: orig}
}

type reopened struct {
	*os.File
	orig *os.File
}

func (r *reopened) Close() error {
	err := r.File.Close()
	if cerr := r.orig.Close(); err == nil {
		err = cerr
	}
	return err
}
