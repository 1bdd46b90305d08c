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
	return "sealed: true needs Linux (a sealed memfd); remove it to run the file itself"
}

// stamp is what changes when a file is written in place.
type stamp struct {
	size  int64
	mtime int64
}

func stampOf(f *os.File) (stamp, error) {
	fi, err := f.Stat()
	if err != nil {
		return stamp{}, err
	}
	return stamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}, nil
}
