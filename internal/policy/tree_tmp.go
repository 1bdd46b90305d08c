package policy

import (
	"context"
	"crypto/sha256"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// treeDigest is a stand-in for digest.Tree until it lands on main.
func treeDigest(ctx context.Context, dir string, progress func(files, bytes int64)) (digest.Digest, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		h.Write([]byte(rel + "\x00"))
		s := sha256.Sum256(b)
		h.Write(s[:])
		return nil
	})
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return digest.FromSum(sum), err
}
