// Package digest computes and compares the digests that pin what cmcp runs
// and records: SHA-256 of files read through the descriptor that will be
// executed, of directory trees, and of RFC 8785 canonical JSON. A digest is
// written "sha256:<64 lowercase hex>". This package does no network I/O.
package digest

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Prefix is the algorithm prefix of every digest string.
const Prefix = "sha256:"

// Digest is a SHA-256 digest. The zero value is "no digest" (IsZero).
type Digest struct {
	sum [sha256.Size]byte
	set bool
}

// ErrMalformed is returned (wrapped) by Parse for any string that is not a
// well-formed digest.
var ErrMalformed = errors.New("malformed digest")

// Parse reads "sha256:<64 lowercase hex digits>". Anything else, including
// upper-case hex, another algorithm or surrounding space, is rejected.
func Parse(s string) (Digest, error) {
	hexPart, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		alg, _, found := strings.Cut(s, ":")
		if found {
			return Digest{}, fmt.Errorf("%w %q: algorithm %q is not supported, want %q followed by 64 hex digits", ErrMalformed, clip(s), alg, Prefix)
		}
		return Digest{}, fmt.Errorf("%w %q: want %q followed by 64 hex digits", ErrMalformed, clip(s), Prefix)
	}
	if len(hexPart) != 2*sha256.Size {
		return Digest{}, fmt.Errorf("%w %q: want 64 hex digits after %q, got %d characters", ErrMalformed, clip(s), Prefix, len(hexPart))
	}
	for i := 0; i < len(hexPart); i++ {
		c := hexPart[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return Digest{}, fmt.Errorf("%w %q: character %d is not a lowercase hex digit", ErrMalformed, clip(s), len(Prefix)+i+1)
		}
	}
	var d Digest
	if _, err := hex.Decode(d.sum[:], []byte(hexPart)); err != nil {
		return Digest{}, fmt.Errorf("%w %q: %v", ErrMalformed, clip(s), err)
	}
	d.set = true
	return d, nil
}

// MustParse is Parse for constants in tests; it panics on error.
func MustParse(s string) Digest {
	d, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return d
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

// FromSum wraps a raw SHA-256 sum.
func FromSum(sum [sha256.Size]byte) Digest { return Digest{sum: sum, set: true} }

// Bytes returns the digest of b.
func Bytes(b []byte) Digest { return FromSum(sha256.Sum256(b)) }

// Sum returns the raw 32 bytes.
func (d Digest) Sum() [sha256.Size]byte { return d.sum }

// IsZero reports whether d holds no digest.
func (d Digest) IsZero() bool { return !d.set }

// String formats d as "sha256:<hex>", or "" for the zero Digest.
func (d Digest) String() string {
	if !d.set {
		return ""
	}
	return Prefix + hex.EncodeToString(d.sum[:])
}

// Equal compares two digests in constant time. Two zero digests are not
// equal: "no pin" never matches anything.
func (d Digest) Equal(o Digest) bool {
	if !d.set || !o.set {
		return false
	}
	return subtle.ConstantTimeCompare(d.sum[:], o.sum[:]) == 1
}

// MarshalText implements encoding.TextMarshaler.
func (d Digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with Parse.
func (d *Digest) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}
