//go:build !linux

package upstream

import (
	"errors"
	"os"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// sealedImage: only Linux has sealed memfds. Elsewhere a stdio upstream is
// refused rather than run from a file that can change after it is measured.
func sealedImage(path string) (*os.File, digest.Digest, error) {
	return nil, digest.Digest{}, &sealError{op: "memfd_create", err: errors.ErrUnsupported}
}

func (e *sealError) hint() string {
	return "stdio upstreams need Linux: the gateway runs them only from a sealed in-memory copy (memfd) of the measured file"
}
