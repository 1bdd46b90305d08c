package execimage

import (
	"fmt"
	"os"
)

// The kernel executes the descriptor the gateway measured, but what an
// interpreter reads after it starts it may read by path: node, given a
// "#!" script as /proc/self/fd/3, resolves that link to a path and reads
// the path (once the measured file was renamed over, the link reads
// "<path> (deleted)", a name anyone who can write the directory can
// create; Python reads the descriptor). A watch remembers what was
// measured at a path and says whether it is still there, unchanged: a
// script is re-checked once the child started and again once it answered
// the MCP handshake, by which time an interpreter has read its main
// module.

// Watch re-checks a measured file or tree.
type Watch interface {
	// Changed says what changed since the measurement, or "", and what
	// to do about it when there is more to say than changedHint.
	Changed() (why, hint string)
	Close()
}

// FileWatch is a measured file: the descriptor it was measured through,
// its stamp before the digest, and its identity.
type FileWatch struct {
	what, path string
	f          *os.File // owned by the watch
	before     Stamp
	id         FileKey
}

// NewFileWatch watches the file measured through f (which the watch then
// owns) at path; before is its stamp taken before the digest.
func NewFileWatch(what, path string, f *os.File, before Stamp) (*FileWatch, error) {
	id, _, err := FdKey(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &FileWatch{what: what, path: path, f: f, before: before, id: id}, nil
}

func (w *FileWatch) Changed() (why, hint string) {
	id, nlink, err := FdKey(w.f)
	if err != nil {
		return fmt.Sprintf("%s %s cannot be checked (%v)", w.what, w.path, err), ""
	}
	if nlink == 0 {
		return fmt.Sprintf("%s %s was removed or replaced (renamed over) after it was measured", w.what, w.path), ""
	}
	if at, err := StatKey(w.path); err != nil || at.dev != id.dev || at.ino != id.ino {
		return fmt.Sprintf("%s %s is no longer the file measured at that path (it was replaced or moved)", w.what, w.path), ""
	}
	if after, err := StampOf(w.f); err != nil || after != w.before {
		return fmt.Sprintf("%s %s was changed (written, renamed or linked) after it was measured", w.what, w.path), ""
	}
	return "", ""
}

func (w *FileWatch) Close() { w.f.Close() }
