package evidence

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"strings"
)

// ParsePublicKey reads an Ed25519 public key from the forms people have at
// hand: PEM "PUBLIC KEY" (PKIX), PEM "PRIVATE KEY" (PKCS #8; only the public
// half is kept), "ed25519:<base64>", 64 hex digits, base64 of 32 bytes, or
// the 32 raw bytes.
func ParsePublicKey(data []byte) (ed25519.PublicKey, error) {
	text := strings.TrimSpace(string(data))
	if blk, _ := pem.Decode([]byte(text)); blk != nil {
		switch blk.Type {
		case "PUBLIC KEY":
			k, err := x509.ParsePKIXPublicKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("PEM PUBLIC KEY: %v", err)
			}
			pub, ok := k.(ed25519.PublicKey)
			if !ok {
				return nil, fmt.Errorf("PEM PUBLIC KEY is %T, want Ed25519", k)
			}
			return pub, nil
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("PEM PRIVATE KEY: %v", err)
			}
			priv, ok := k.(ed25519.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("PEM PRIVATE KEY is %T, want Ed25519", k)
			}
			return priv.Public().(ed25519.PublicKey), nil
		default:
			return nil, fmt.Errorf("PEM block %q: want PUBLIC KEY or PRIVATE KEY", blk.Type)
		}
	}
	if len(data) == ed25519.PublicKeySize && !isPrintable(data) {
		return ed25519.PublicKey(bytes.Clone(data)), nil
	}
	s := strings.TrimPrefix(text, KeyAlgEd25519+":")
	if b, err := hex.DecodeString(s); err == nil && len(b) == ed25519.PublicKeySize {
		return b, nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil && len(b) == ed25519.PublicKeySize {
			return b, nil
		}
	}
	return nil, fmt.Errorf("not an Ed25519 public key: want PEM, ed25519:<base64>, 64 hex digits or 32 raw bytes")
}

func isPrintable(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// FormatPublicKey writes a key as "ed25519:<base64>".
func FormatPublicKey(pub ed25519.PublicKey) string {
	return KeyAlgEd25519 + ":" + base64.StdEncoding.EncodeToString(pub)
}
