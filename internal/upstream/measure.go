package upstream

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// resolveCommand finds name on pathEnv like the gateway's exec would and
// returns the real file behind any symlinks.
func resolveCommand(name, pathEnv string) (string, error) {
	p := name
	if !strings.Contains(name, "/") {
		found := ""
		for _, dir := range filepath.SplitList(pathEnv) {
			if dir == "" {
				dir = "."
			}
			cand := filepath.Join(dir, name)
			if st, err := os.Stat(cand); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				found = cand
				break
			}
		}
		if found == "" {
			return "", fmt.Errorf("command %q not found on PATH %q", name, pathEnv)
		}
		p = found
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("resolve command %q: %w", name, err)
	}
	real, err = filepath.Abs(real)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("resolve command %q: %w", name, err)
	}
	if st.IsDir() {
		return "", fmt.Errorf("command %q resolves to directory %s", name, real)
	}
	if st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("command %q resolves to %s, which is not executable", name, real)
	}
	return real, nil
}

// openMeasured opens path and digests it through the descriptor, without
// moving its offset.
func openMeasured(path string) (*os.File, digest.Digest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, digest.Digest{}, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<62)); err != nil {
		f.Close()
		return nil, digest.Digest{}, fmt.Errorf("digest %s: %w", path, err)
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return f, digest.FromSum(sum), nil
}

// measureTarget digests a pinned measure target: a file, or a directory as a
// tree digest.
func measureTarget(ctx context.Context, path string) (digest.Digest, error) {
	st, err := os.Stat(path)
	if err != nil {
		return digest.Digest{}, err
	}
	if st.IsDir() {
		return treeDigest(ctx, path)
	}
	f, d, err := openMeasured(path)
	if err != nil {
		return digest.Digest{}, err
	}
	f.Close()
	return d, nil
}

var errTreeUnavailable = errors.New("tree digests need pkg/digest.Tree")

func treeDigest(ctx context.Context, dir string) (digest.Digest, error) {
	return digest.Digest{}, errTreeUnavailable
}

var _ = exec.ErrNotFound
