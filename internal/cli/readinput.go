package cli

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// maxInputFile bounds every file cmcp reads whole on behalf of a flag or an
// argument (evidence, certificates, keys, checkpoints, proofs, roots,
// reference values). None is legitimately near this size; without a bound
// a device such as /dev/zero or /dev/urandom (or a runaway file) would make
// cmcp read until memory runs out.
const maxInputFile = 64 << 20

// readInput is os.ReadFile with the bound above. A larger input is an
// *fs.PathError ("read PATH: larger than ..."), so callers report it like
// any other read failure (exit 3) and name the file.
func readInput(path string) ([]byte, error) {
	return readInputMax(path, maxInputFile)
}

func readInputMax(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// A regular file's size is known: one over the bound is refused before
	// a byte of it is read. A device or a pipe has no true size, and a
	// file may grow while it is read: the read itself is bounded too.
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: errTooLarge(limit)}
	}
	// In chunks kept as read (doubling from 64 KiB up to 4 MiB), joined at
	// the end: each byte is written once, not copied again at every growth
	// of one slice (an endless device costs its 64 MiB once).
	var chunks [][]byte
	var n int64
	for n <= limit {
		c := make([]byte, min(max(64<<10, n), 4<<20, limit+1-n))
		k, err := io.ReadFull(f, c)
		chunks, n = append(chunks, c[:k]), n+int64(k)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if n > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: errTooLarge(limit)}
	}
	if len(chunks) == 1 {
		return chunks[0], nil
	}
	return bytes.Join(chunks, nil), nil
}

func errTooLarge(limit int64) error {
	return fmt.Errorf("larger than %d MiB: not a file cmcp reads (a device, or the wrong file?)", limit>>20)
}
