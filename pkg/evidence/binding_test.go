package evidence

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha512"
	"encoding/hex"
	"strings"
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

// TestBindingClaimSaysWhenNoKeyWasExpected: a binding claim checked without
// an expected key or statement says that it compared them with nothing.
// Before, it read "report data binds key ..." exactly as when the auditor's
// key had been checked.
func TestBindingClaimSaysWhenNoKeyWasExpected(t *testing.T) {
	bd := newBinding(t)
	quote, roots, _ := fakeSNPQuote(t, bd.rd, snpFake{})
	for _, c := range []struct {
		name string
		opts VerifyOptions
		want string
	}{
		{"nothing expected", VerifyOptions{Roots: roots, ExpectNonce: bd.nonce}, "; no expected key or statement given: the bundle's own, not compared with the one you expect"},
		{"key expected", VerifyOptions{Roots: roots, ExpectNonce: bd.nonce, ExpectKey: bd.pub}, "; no expected statement given"},
		{"statement expected", VerifyOptions{Roots: roots, ExpectNonce: bd.nonce, ExpectStatement: bd.stmt}, "; no expected key given"},
		{"both expected", VerifyOptions{Roots: roots, ExpectNonce: bd.nonce, ExpectKey: bd.pub, ExpectStatement: bd.stmt}, ""},
	} {
		r, _ := Verify(snpBundle(t, bd, quote), c.opts)
		cl := r.Claim(ClaimBinding)
		if cl == nil || cl.Status != StatusAffirming || r.Binding != BindingOurs {
			t.Fatalf("%s: %+v", c.name, cl)
		}
		if c.want == "" && strings.Contains(cl.Reason, "no expected") || c.want != "" && !strings.Contains(cl.Reason, c.want) {
			t.Errorf("%s: binding claim %q, want %q", c.name, cl.Reason, c.want)
		}
	}
}
