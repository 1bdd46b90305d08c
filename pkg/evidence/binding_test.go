package evidence

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha512"
	"encoding/hex"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// The documented encoding, written out byte by byte.
func TestReportDataDocumentedBytes(t *testing.T) {
	pub := ed25519.PublicKey(bytes.Repeat([]byte{0x11}, 32))
	nonce := []byte{0xde, 0xad, 0xbe, 0xef}
	stmt := digest.Bytes([]byte("genesis"))
	var msg []byte
	msg = append(msg, "cmcp-attest-binding-v1"...)
	msg = append(msg, 0)
	msg = append(msg, 0, 0, 0, 7)
	msg = append(msg, "ed25519"...)
	msg = append(msg, 0, 0, 0, 32)
	msg = append(msg, pub...)
	msg = append(msg, 0, 0, 0, 4)
	msg = append(msg, nonce...)
	msg = append(msg, 0, 0, 0, 71)
	msg = append(msg, stmt.String()...)
	want := sha512.Sum512(msg)
	got, err := ReportData(pub, nonce, stmt)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("ReportData = %x, want %x", got, want)
	}
	// A stable vector, so that an accidental change of the encoding fails here.
	const vector = "d0b0288d95bb1fc6e2249583485837e424115035d10ef56059020e4c4bd8dc5a406b51d4c6fd030b34b0e40b9bedc6bc54e9ffa96448970e79e278f697f027ef"
	if h := hex.EncodeToString(got[:]); h != vector {
		t.Fatalf("binding vector changed: %s (change the encoding only together with BindingDomain)", h)
	}
}

func TestReportDataSeparatesFields(t *testing.T) {
	pub := ed25519.PublicKey(bytes.Repeat([]byte{1}, 32))
	other := ed25519.PublicKey(bytes.Repeat([]byte{2}, 32))
	s1, s2 := digest.Bytes([]byte("a")), digest.Bytes([]byte("b"))
	base, _ := ReportData(pub, []byte("n"), s1)
	cases := map[string][64]byte{}
	cases["other key"], _ = ReportData(other, []byte("n"), s1)
	cases["other nonce"], _ = ReportData(pub, []byte("m"), s1)
	cases["empty nonce"], _ = ReportData(pub, nil, s1)
	cases["other statement"], _ = ReportData(pub, []byte("n"), s2)
	cases["no statement"], _ = ReportData(pub, []byte("n"), digest.Digest{})
	for name, rd := range cases {
		if rd == base {
			t.Errorf("%s: same report data", name)
		}
	}
	if _, err := ReportData(pub[:31], nil, s1); err == nil {
		t.Error("31-byte key accepted")
	}
	if _, err := ReportData(pub, make([]byte, MaxNonceSize+1), s1); err == nil {
		t.Error("oversized nonce accepted")
	}
}
