package auditlog

import (
	"crypto/sha256"
	"fmt"
	"math/bits"

	"golang.org/x/mod/sumdb/tlog"
)

// frontier is an RFC 6962 compact range over [0, n): the roots of the
// perfect subtrees of the binary decomposition of n, largest first.
type frontier struct {
	n      int64
	hashes []tlog.Hash
}

func (f *frontier) append(leaf tlog.Hash) {
	h := leaf
	for k := 0; f.n>>k&1 == 1; k++ {
		h = tlog.NodeHash(f.hashes[len(f.hashes)-1], h)
		f.hashes = f.hashes[:len(f.hashes)-1]
	}
	f.hashes = append(f.hashes, h)
	f.n++
}

// root returns the tree hash of [0, n). The empty tree hashes to SHA-256("").
func (f *frontier) root() tlog.Hash {
	if len(f.hashes) == 0 {
		return sha256.Sum256(nil)
	}
	r := f.hashes[len(f.hashes)-1]
	for i := len(f.hashes) - 2; i >= 0; i-- {
		r = tlog.NodeHash(f.hashes[i], r)
	}
	return r
}

func (f *frontier) clone() frontier {
	return frontier{n: f.n, hashes: append([]tlog.Hash(nil), f.hashes...)}
}

// frontierFrom rebuilds a frontier of size n from its hashes.
func frontierFrom(n int64, hs [][]byte) (frontier, error) {
	if want := bits.OnesCount64(uint64(n)); len(hs) != want {
		return frontier{}, fmt.Errorf("frontier for size %d needs %d hashes, has %d", n, want, len(hs))
	}
	f := frontier{n: n}
	for i, h := range hs {
		if len(h) != tlog.HashSize {
			return frontier{}, fmt.Errorf("frontier hash %d is %d bytes, want %d", i, len(h), tlog.HashSize)
		}
		f.hashes = append(f.hashes, tlog.Hash(h))
	}
	return f, nil
}
