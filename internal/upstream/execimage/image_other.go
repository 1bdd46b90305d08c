//go:build !linux

package execimage

import (
	"errors"
	"os"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Sealed: only Linux has sealed memfds; an upstream with sealed: true
// is refused elsewhere.
func Sealed(path string) (*os.File, digest.Digest, error) {
	return nil, digest.Digest{}, &SealError{op: "memfd_create", err: errors.ErrUnsupported}
}

func (e *SealError) Hint() string {
	return "sealed: true needs Linux (a sealed memfd)"
}

// Stamp: unused where stdio upstreams are refused.
type Stamp struct{}

func StampOf(*os.File) (Stamp, error) { return Stamp{}, errors.ErrUnsupported }

// Supported: a child is executed through /proc/self/fd/3, and
// its group is watched by a reaper run from /proc/self/exe: Linux only.
func Supported() error {
	return errors.New("stdio upstreams need Linux: the gateway executes the measured file through /proc/self/fd and watches the child's process group from /proc/self/exe")
}
