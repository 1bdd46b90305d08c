// Package ageid opens age X25519 stanzas with a cached crypto/ecdh key, so
// that an auditor opening many vault payloads (each its own age file) pays
// for one scalar multiplication per payload instead of two.
package ageid

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"filippo.io/age"
	"golang.org/x/crypto/chacha20poly1305"
)

// x25519Identity is an age X25519 identity that keeps its scalar as a
// crypto/ecdh private key. age's own X25519Identity goes through
// curve25519.X25519, which rebuilds the private key, and so multiplies the
// base point, on every Unwrap: nearly half the cost of opening one vault
// payload (each is its own age file, so each costs one X25519). The unwrap
// is age's X25519 recipient stanza (age-encryption.org/v1, section
// "X25519 recipient stanza"); the file key it returns is then checked by
// age against the header MAC, so a mistake here cannot open anything.
type x25519Identity struct {
	priv *ecdh.PrivateKey
	pub  []byte
}

const x25519Label = "age-encryption.org/v1/X25519"

var ageB64 = base64.RawStdEncoding.Strict()

// FastIdentities replaces each *age.X25519Identity of ids with an
// equivalent x25519Identity; other identities are kept as they are.
func FastIdentities(ids []age.Identity) []age.Identity {
	out := make([]age.Identity, len(ids))
	for i, id := range ids {
		out[i] = id
		if x, ok := id.(*age.X25519Identity); ok {
			if f, err := NewX25519Identity(x); err == nil {
				out[i] = f
			}
		}
	}
	return out
}

// NewX25519Identity returns the cached-key form of x.
func NewX25519Identity(x *age.X25519Identity) (*x25519Identity, error) {
	hrp, scalar, err := Bech32Decode(x.String())
	if err != nil || hrp != "age-secret-key-" || len(scalar) != 32 {
		return nil, fmt.Errorf("not an age X25519 identity: %v", err)
	}
	priv, err := ecdh.X25519().NewPrivateKey(scalar)
	if err != nil {
		return nil, err
	}
	pub := priv.PublicKey().Bytes()
	// The recipient age derives must be ours: the decoding was right.
	hrp, rpub, err := Bech32Decode(x.Recipient().String())
	if err != nil || hrp != "age" || !bytes.Equal(rpub, pub) {
		return nil, errors.New("the identity's public key does not match its recipient")
	}
	return &x25519Identity{priv: priv, pub: pub}, nil
}

// Unwrap implements age.Identity.
func (i *x25519Identity) Unwrap(stanzas []*age.Stanza) ([]byte, error) {
	for _, s := range stanzas {
		k, err := i.unwrap(s)
		if errors.Is(err, age.ErrIncorrectIdentity) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return k, nil
	}
	return nil, age.ErrIncorrectIdentity
}

func (i *x25519Identity) unwrap(s *age.Stanza) ([]byte, error) {
	if s.Type != "X25519" {
		return nil, age.ErrIncorrectIdentity
	}
	if len(s.Args) != 1 || strings.ContainsAny(s.Args[0], "\r\n") {
		return nil, errors.New("invalid X25519 recipient block")
	}
	share, err := ageB64.DecodeString(s.Args[0])
	if err != nil {
		return nil, fmt.Errorf("failed to parse X25519 recipient: %v", err)
	}
	peer, err := ecdh.X25519().NewPublicKey(share)
	if err != nil {
		return nil, errors.New("invalid X25519 recipient block")
	}
	shared, err := i.priv.ECDH(peer) // fails on a low-order share (all-zero secret)
	if err != nil {
		return nil, fmt.Errorf("invalid X25519 recipient: %v", err)
	}
	salt := make([]byte, 0, len(share)+len(i.pub))
	salt = append(append(salt, share...), i.pub...)
	wk, err := hkdf.Key(sha256.New, shared, salt, x25519Label, chacha20poly1305.KeySize)
	if err != nil {
		return nil, err
	}
	aead, err := chacha20poly1305.New(wk)
	if err != nil {
		return nil, err
	}
	const fileKeySize = 16
	if len(s.Body) != fileKeySize+aead.Overhead() {
		return nil, errors.New("invalid X25519 recipient block: incorrect file key size")
	}
	fk, err := aead.Open(nil, make([]byte, chacha20poly1305.NonceSize), s.Body, nil)
	if err != nil {
		return nil, age.ErrIncorrectIdentity
	}
	return fk, nil
}

// Bech32Decode decodes a Bech32 string (BIP 173 checksum, no length limit,
// as age uses it) into its lower-case human-readable part and its bytes.
func Bech32Decode(s string) (string, []byte, error) {
	const charset = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
	if strings.ToLower(s) != s && strings.ToUpper(s) != s {
		return "", nil, errors.New("mixed case")
	}
	s = strings.ToLower(s)
	sep := strings.LastIndexByte(s, '1')
	if sep < 1 || sep+7 > len(s) {
		return "", nil, errors.New("no separator or checksum")
	}
	hrp := s[:sep]
	var vals []byte
	for i := 0; i < len(hrp); i++ {
		if hrp[i] < 33 || hrp[i] > 126 {
			return "", nil, errors.New("invalid character in the human-readable part")
		}
		vals = append(vals, hrp[i]>>5)
	}
	vals = append(vals, 0)
	for i := 0; i < len(hrp); i++ {
		vals = append(vals, hrp[i]&31)
	}
	ds := len(vals)
	for i := sep + 1; i < len(s); i++ {
		v := strings.IndexByte(charset, s[i])
		if v < 0 {
			return "", nil, fmt.Errorf("invalid character %q", s[i])
		}
		vals = append(vals, byte(v))
	}
	gen := [5]uint32{0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3}
	chk := uint32(1)
	for _, v := range vals {
		b := chk >> 25
		chk = (chk&0x1ffffff)<<5 ^ uint32(v)
		for i := range 5 {
			if (b>>i)&1 == 1 {
				chk ^= gen[i]
			}
		}
	}
	if chk != 1 {
		return "", nil, errors.New("bad checksum")
	}
	data := vals[ds : len(vals)-6]
	var out []byte
	var acc uint32
	bits := 0
	for _, v := range data {
		acc = acc<<5 | uint32(v)
		bits += 5
		for bits >= 8 {
			bits -= 8
			out = append(out, byte(acc>>bits))
		}
	}
	if bits >= 5 || acc&(1<<bits-1) != 0 {
		return "", nil, errors.New("bad padding")
	}
	return hrp, out, nil
}
