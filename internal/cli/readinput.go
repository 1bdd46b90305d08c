package cli

import (
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
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: errTooLarge(limit)}
	}
	return data, nil
}

func errTooLarge(limit int64) error {
	return fmt.Errorf("larger than %d MiB: not a file cmcp reads (a device, or the wrong file?)", limit>>20)
}
