package evidence

import (
	"crypto/ed25519"
	"crypto/sha512"
	"encoding/binary"
	"fmt"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// BindingDomain separates cmcp's report data from any other use of the
// hardware's report data field. It changes if the encoding ever changes.
const BindingDomain = "cmcp-attest-binding-v1"

// KeyAlgEd25519 is the only key algorithm bound today.
const KeyAlgEd25519 = "ed25519"

// MaxNonceSize is the largest nonce accepted.
const MaxNonceSize = 1024

// ReportDataSize is the size of SNP REPORT_DATA and TDX REPORTDATA.
const ReportDataSize = 64

// ReportData returns the 64 bytes that bind pub, nonce and statement (see the
// package documentation for the exact encoding). A zero statement is encoded
// as an empty field.
func ReportData(pub ed25519.PublicKey, nonce []byte, statement digest.Digest) ([ReportDataSize]byte, error) {
	var out [ReportDataSize]byte
	if len(pub) != ed25519.PublicKeySize {
		return out, fmt.Errorf("public key is %d bytes, want a %d-byte Ed25519 key", len(pub), ed25519.PublicKeySize)
	}
	if len(nonce) > MaxNonceSize {
		return out, fmt.Errorf("nonce is %d bytes, at most %d allowed", len(nonce), MaxNonceSize)
	}
	h := sha512.New()
	h.Write([]byte(BindingDomain))
	h.Write([]byte{0})
	field := func(b []byte) {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte(KeyAlgEd25519))
	field(pub)
	field(nonce)
	field([]byte(statement.String()))
	copy(out[:], h.Sum(nil))
	return out, nil
}
