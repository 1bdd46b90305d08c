// Package c2sp reads and writes the transparency-log formats of
// c2sp.org that cmcp's audit log uses, independent of its records: signed
// checkpoints (tlog-checkpoint) and their Ed25519 note keys (signed-note),
// witness cosignatures (tlog-cosignature, cosignature/v1) and offline
// inclusion proofs (tlog-proof@v1). It does no file or network I/O except
// LoadOrCreateLogKey, which keeps a log key in a file.
package c2sp

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Checkpoint is a parsed C2SP tlog-checkpoint: origin, tree size, root hash.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   tlog.Hash
	Note   []byte // the signed note as stored
}

// CheckpointBody formats the three-line checkpoint body (origin, size,
// base64 root hash), the text a checkpoint note signs.
func CheckpointBody(origin string, size int64, root tlog.Hash) string {
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
	return ParseCheckpointBody(string(text) + "\n")
}

// ParseCheckpointBody parses the text of a checkpoint note (what
// CheckpointBody formats, with any extension lines) without signatures.
func ParseCheckpointBody(text string) (*Checkpoint, error) {
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
	cp, err := ParseCheckpointBody(n.Text)
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

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}
