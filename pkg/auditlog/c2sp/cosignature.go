package c2sp

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"

	"golang.org/x/mod/sumdb/note"
)

// Cosignatures (c2sp.org/tlog-cosignature, cosignature/v1, Ed25519).

const sigCosignatureV1 = 0x04

type cosigVerifier struct {
	name string
	hash uint32
	pub  ed25519.PublicKey
}

func (v *cosigVerifier) Name() string    { return v.name }
func (v *cosigVerifier) KeyHash() uint32 { return v.hash }
func (v *cosigVerifier) Verify(msg, sig []byte) bool {
	if len(sig) != 8+ed25519.SignatureSize {
		return false
	}
	var t uint64
	for _, b := range sig[:8] {
		t = t<<8 | uint64(b)
	}
	m := make([]byte, 0, 64+len(msg))
	m = fmt.Appendf(m, "cosignature/v1\ntime %d\n", t)
	m = append(m, msg...)
	return ed25519.Verify(v.pub, m, sig[8:])
}

// NewCosignatureVerifier parses a witness's cosignature verifier key
// ("<name>+<hash8>+<base64(0x04 || Ed25519 public key)>") into a
// note.Verifier that checks cosignature/v1 signatures.
func NewCosignatureVerifier(vkey string) (note.Verifier, error) {
	name, rest, ok := strings.Cut(vkey, "+")
	h16, b64k, ok2 := strings.Cut(rest, "+")
	if !ok || !ok2 || name == "" || len(h16) != 8 {
		return nil, fmt.Errorf("witness key %q: want <name>+<8 hex digits>+<base64 key>", clip(vkey))
	}
	raw, err := base64.StdEncoding.DecodeString(b64k)
	if err != nil {
		return nil, fmt.Errorf("witness key %q: %w", clip(vkey), err)
	}
	if len(raw) != 1+ed25519.PublicKeySize || raw[0] != sigCosignatureV1 {
		return nil, fmt.Errorf("witness key %q is not an Ed25519 cosignature key (want type 0x04 and 32 bytes; a 0x01 key is a log's note key, not a witness's)", clip(vkey))
	}
	var want uint32
	if _, err := fmt.Sscanf(h16, "%08x", &want); err != nil {
		return nil, fmt.Errorf("witness key %q: key hash: %w", clip(vkey), err)
	}
	v := &cosigVerifier{name: name, pub: ed25519.PublicKey(raw[1:]), hash: NoteKeyHash(name, raw)}
	if v.hash != want {
		return nil, fmt.Errorf("witness key %q: key hash %08x does not match the key (%08x)", clip(vkey), want, v.hash)
	}
	return v, nil
}

// CosignatureTime returns the timestamp of a cosignature/v1 signature
// (seconds since the Unix epoch) from its base64 form as a note.Signature.
func CosignatureTime(sig note.Signature) (int64, error) {
	raw, err := base64.StdEncoding.DecodeString(sig.Base64)
	if err != nil || len(raw) != 4+8+ed25519.SignatureSize {
		return 0, fmt.Errorf("not a cosignature/v1 signature")
	}
	var t uint64
	for _, b := range raw[4:12] {
		t = t<<8 | uint64(b)
	}
	return int64(t), nil
}

// NoteKeyHash is the key hash of a signed-note key: the first four bytes
// of SHA-256(name || "\n" || key), key being the type byte and the key.
func NoteKeyHash(name string, key []byte) uint32 {
	h := sha256.Sum256(append(append([]byte(name), '\n'), key...))
	return uint32(h[0])<<24 | uint32(h[1])<<16 | uint32(h[2])<<8 | uint32(h[3])
}
