package upstream

import (
	"fmt"
	"os"
	"syscall"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// sealError is a failure to make the sealed copy: the spawn is refused,
// never run from the file instead.
type sealError struct {
	op  string
	err error
}

func (e *sealError) Error() string { return e.op + ": " + e.err.Error() }
func (e *sealError) Unwrap() error { return e.err }

// fileImage opens the file at path to execute it through its descriptor,
// and digests it through that descriptor. The stamp, taken before the
// digest, lets the caller check once the child runs that the file was not
// written meanwhile (then the child may run other bytes than measured).
func fileImage(path string) (*os.File, digest.Digest, stamp, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, digest.Digest{}, stamp{}, fmt.Errorf("open %s: %w", path, err)
	}
	st, err := stampOf(f)
	if err != nil {
		f.Close()
		return nil, digest.Digest{}, stamp{}, err
	}
	d, err := digest.File(f)
	if err != nil {
		f.Close()
		return nil, digest.Digest{}, stamp{}, err
	}
	return f, d, st, nil
}
