//go:build !linux

package upstream

import (
	"errors"
	"os"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// sealedImage: only Linux has sealed memfds; an upstream with sealed: true
// is refused elsewhere.
func sealedImage(path string) (*os.File, digest.Digest, error) {
	return nil, digest.Digest{}, &sealError{op: "memfd_create", err: errors.ErrUnsupported}
}

func (e *sealError) hint() string {
	return "sealed: true needs Linux (a sealed memfd)"
}

// stamp: unused where stdio upstreams are refused.
type stamp struct{}

func stampOf(*os.File) (stamp, error) { return stamp{}, errors.ErrUnsupported }

// platformSupportsStdio: a child is executed through /proc/self/fd/3, and
// its group is watched by a reaper run from /proc/self/exe: Linux only.
func platformSupportsStdio() error {
	return errors.New("stdio upstreams need Linux: the gateway executes the measured file through /proc/self/fd and watches the child's process group from /proc/self/exe")
}
