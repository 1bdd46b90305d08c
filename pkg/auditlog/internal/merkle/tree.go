// Package merkle is the RFC 6962 Merkle tree of an audit log kept as a
// compact range (a frontier): what the writer, the epoch scanner and the
// verifiers append leaves to and take roots of. It knows nothing of
// records or files.
package merkle

import (
	"crypto/sha256"
	"fmt"
	"math/bits"

	"golang.org/x/mod/sumdb/tlog"
)

// Frontier is an RFC 6962 compact range over [0, N): the roots of the
// perfect subtrees of the binary decomposition of N, largest first.
type Frontier struct {
	N      int64
	Hashes []tlog.Hash
}

// Append adds a leaf hash to the tree.
func (f *Frontier) Append(leaf tlog.Hash) {
	h := leaf
	for k := 0; f.N>>k&1 == 1; k++ {
		h = tlog.NodeHash(f.Hashes[len(f.Hashes)-1], h)
		f.Hashes = f.Hashes[:len(f.Hashes)-1]
	}
	f.Hashes = append(f.Hashes, h)
	f.N++
}

// Root returns the tree hash of [0, N). The empty tree hashes to SHA-256("").
func (f *Frontier) Root() tlog.Hash {
	if len(f.Hashes) == 0 {
		return sha256.Sum256(nil)
	}
	r := f.Hashes[len(f.Hashes)-1]
	for i := len(f.Hashes) - 2; i >= 0; i-- {
		r = tlog.NodeHash(f.Hashes[i], r)
	}
	return r
}

// Clone returns a copy that shares no memory with f.
func (f *Frontier) Clone() Frontier {
	return Frontier{N: f.N, Hashes: append([]tlog.Hash(nil), f.Hashes...)}
}

// FrontierFrom rebuilds a frontier of size n from its hashes.
func FrontierFrom(n int64, hs [][]byte) (Frontier, error) {
	if want := bits.OnesCount64(uint64(n)); len(hs) != want {
		return Frontier{}, fmt.Errorf("frontier for size %d needs %d hashes, has %d", n, want, len(hs))
	}
	f := Frontier{N: n}
	for i, h := range hs {
		if len(h) != tlog.HashSize {
			return Frontier{}, fmt.Errorf("frontier hash %d is %d bytes, want %d", i, len(h), tlog.HashSize)
		}
		f.Hashes = append(f.Hashes, tlog.Hash(h))
	}
	return f, nil
}
