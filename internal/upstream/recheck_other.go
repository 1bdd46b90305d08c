//go:build !linux

package upstream

import (
	"errors"
	"io/fs"
	"os"
)

// fileKey: unused where stdio upstreams are refused.
type fileKey struct {
	mode     uint32
	dev, ino uint64
}

func infoKey(fs.FileInfo) (fileKey, bool)     { return fileKey{}, false }
func lstatKey(string) (fileKey, error)        { return fileKey{}, errors.ErrUnsupported }
func statKey(string) (fileKey, error)         { return fileKey{}, errors.ErrUnsupported }
func fdKey(*os.File) (fileKey, uint64, error) { return fileKey{}, 0, errors.ErrUnsupported }
func dupFile(*os.File) (*os.File, error)      { return nil, errors.ErrUnsupported }

const syscallDir = 0o040000
