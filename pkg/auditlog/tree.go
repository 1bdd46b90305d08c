package auditlog

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
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

// Checkpoint is a parsed C2SP tlog-checkpoint: origin, tree size, root hash.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   tlog.Hash
	Note   []byte // the signed note as stored
}

// checkpointBody formats the three-line checkpoint body.
func checkpointBody(origin string, size int64, root tlog.Hash) string {
	return origin + "\n" + strconv.FormatInt(size, 10) + "\n" + base64.StdEncoding.EncodeToString(root[:]) + "\n"
}

// ErrMalformedCheckpoint is returned (wrapped) for a checkpoint that is not
// a well-formed C2SP signed checkpoint.
var ErrMalformedCheckpoint = errors.New("malformed checkpoint")

// ParseCheckpoint parses the body of a signed checkpoint note without
// checking signatures. Use OpenCheckpoint to verify.
func ParseCheckpoint(msg []byte) (*Checkpoint, error) {
	if len(msg) > 64<<10 {
		return nil, fmt.Errorf("%w: %d bytes is too large", ErrMalformedCheckpoint, len(msg))
	}
	text, _, ok := bytes.Cut(msg, []byte("\n\n"))
	if !ok {
		return nil, fmt.Errorf("%w: no blank line before the signatures", ErrMalformedCheckpoint)
	}
	return parseBody(string(text) + "\n")
}

func parseBody(text string) (*Checkpoint, error) {
	lines := strings.Split(text, "\n")
	// origin, size, root, then optional extension lines; text ends in "\n".
	if len(lines) < 4 || lines[len(lines)-1] != "" {
		return nil, fmt.Errorf("%w: want origin, size and root hash lines", ErrMalformedCheckpoint)
	}
	origin := lines[0]
	if origin == "" || strings.ContainsAny(origin, " +\t") {
		return nil, fmt.Errorf("%w: origin %q", ErrMalformedCheckpoint, clip(origin))
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil || size < 0 || strconv.FormatInt(size, 10) != lines[1] {
		return nil, fmt.Errorf("%w: size %q is not a decimal number", ErrMalformedCheckpoint, clip(lines[1]))
	}
	hb, err := base64.StdEncoding.Strict().DecodeString(lines[2])
	if err != nil || len(hb) != tlog.HashSize {
		return nil, fmt.Errorf("%w: root hash %q is not 32 bytes of base64", ErrMalformedCheckpoint, clip(lines[2]))
	}
	return &Checkpoint{Origin: origin, Size: size, Root: tlog.Hash(hb)}, nil
}

// OpenCheckpoint verifies a signed checkpoint note against verifiers and
// parses it. The error wraps note's typed errors: *note.UnverifiedNoteError
// (no trusted key signed it) or *note.InvalidSignatureError (a trusted key's
// signature is bad).
func OpenCheckpoint(msg []byte, vs note.Verifiers) (*Checkpoint, error) {
	if _, err := ParseCheckpoint(msg); err != nil {
		return nil, err
	}
	n, err := note.Open(msg, vs)
	if err != nil {
		return nil, err
	}
	cp, err := parseBody(n.Text)
	if err != nil {
		return nil, err
	}
	cp.Note = msg
	return cp, nil
}

// signer is a note.Signer over an Ed25519 key.
type signer struct {
	name string
	hash uint32
	key  ed25519.PrivateKey
}

func (s *signer) Name() string                    { return s.name }
func (s *signer) KeyHash() uint32                 { return s.hash }
func (s *signer) Sign(msg []byte) ([]byte, error) { return ed25519.Sign(s.key, msg), nil }

// NewNoteKeys returns the note signer and the verifier key string for an
// Ed25519 key under name (the log origin).
func NewNoteKeys(name string, key ed25519.PrivateKey) (note.Signer, string, error) {
	pub, ok := key.Public().(ed25519.PublicKey)
	if !ok || len(key) != ed25519.PrivateKeySize {
		return nil, "", errors.New("signing key is not an Ed25519 private key")
	}
	vkey, err := note.NewEd25519VerifierKey(name, pub)
	if err != nil {
		return nil, "", fmt.Errorf("signing key: %w", err)
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		return nil, "", fmt.Errorf("signing key: %w", err)
	}
	return &signer{name: name, hash: v.KeyHash(), key: key}, vkey, nil
}

var _ = binary.BigEndian
