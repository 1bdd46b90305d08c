package upstream

import (
	"context"
	"os"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// measureTarget digests a pinned measure target: a file (a script), or a
// directory (a package tree, every file counted) as a tree digest.
func measureTarget(ctx context.Context, path string) (digest.Digest, error) {
	st, err := os.Stat(path)
	if err != nil {
		return digest.Digest{}, err
	}
	if st.IsDir() {
		return digest.Tree(ctx, path, digest.TreeOptions{})
	}
	f, d, err := digest.OpenFile(path)
	if err != nil {
		return digest.Digest{}, err
	}
	f.Close()
	return d, nil
}
