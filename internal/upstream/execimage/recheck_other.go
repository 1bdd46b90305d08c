//go:build !linux

package execimage

import (
	"errors"
	"io/fs"
	"os"
)

// FileKey: unused where stdio upstreams are refused.
type FileKey struct {
	mode     uint32
	dev, ino uint64
}

func infoKey(fs.FileInfo) (FileKey, bool)     { return FileKey{}, false }
func lstatKey(string) (FileKey, error)        { return FileKey{}, errors.ErrUnsupported }
func StatKey(string) (FileKey, error)         { return FileKey{}, errors.ErrUnsupported }
func FdKey(*os.File) (FileKey, uint64, error) { return FileKey{}, 0, errors.ErrUnsupported }
func DupFile(*os.File) (*os.File, error)      { return nil, errors.ErrUnsupported }

const syscallDir = 0o040000
