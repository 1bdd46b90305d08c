package execimage

import (
	"fmt"
	"os"
	"syscall"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// SealError is a failure to make the sealed copy: the spawn is refused,
// never run from the file instead.
type SealError struct {
	op  string
	err error
}

func (e *SealError) Error() string { return e.op + ": " + e.err.Error() }
func (e *SealError) Unwrap() error { return e.err }

// Open opens the file at path to execute it through its descriptor,
// and digests it through that descriptor. The stamp, taken before the
// digest, lets the caller check once the child runs that the file was not
// written meanwhile (then the child may run other bytes than measured).
func Open(path string) (*os.File, digest.Digest, Stamp, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, digest.Digest{}, Stamp{}, fmt.Errorf("open %s: %w", path, err)
	}
	st, err := StampOf(f)
	if err != nil {
		f.Close()
		return nil, digest.Digest{}, Stamp{}, err
	}
	d, err := digest.File(f)
	if err != nil {
		f.Close()
		return nil, digest.Digest{}, Stamp{}, err
	}
	return f, d, st, nil
}
