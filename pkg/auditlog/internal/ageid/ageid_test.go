package ageid

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
)

func ageEncrypt(t *testing.T, msg []byte, rs ...age.Recipient) []byte {
	t.Helper()
	var b bytes.Buffer
	w, err := age.Encrypt(&b, rs...)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(msg)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestFastX25519Identity checks the cached-key identity against age's own:
// it opens what age encrypts (to it alone, or among other recipients),
// refuses what is encrypted to others with age's error, and is built from
// the auditor identity of the fixture.
func TestFastX25519Identity(t *testing.T) {
	me, _ := age.GenerateX25519Identity()
	other, _ := age.GenerateX25519Identity()
	f, err := NewX25519Identity(me)
	if err != nil {
		t.Fatal(err)
	}
	if ids := FastIdentities([]age.Identity{me}); ids[0] == age.Identity(me) {
		t.Fatal("an X25519 identity was not replaced")
	}
	msg := []byte(`{"path":"/srv/data/a.txt"}`)
	for _, rs := range [][]age.Recipient{{me.Recipient()}, {other.Recipient(), me.Recipient()}} {
		ct := ageEncrypt(t, msg, rs...)
		r, err := age.Decrypt(bytes.NewReader(ct), f)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r)
		if !bytes.Equal(got, msg) {
			t.Fatalf("got %q", got)
		}
	}
	_, err = age.Decrypt(bytes.NewReader(ageEncrypt(t, msg, other.Recipient())), f)
	var nm *age.NoIdentityMatchError
	if !errors.As(err, &nm) {
		t.Fatalf("a file for another recipient: %v", err)
	}
	// A damaged wrapped file key is not this identity's.
	ct := ageEncrypt(t, msg, me.Recipient())
	hdrEnd := bytes.Index(ct, []byte("\n---"))
	lines := bytes.Split(ct[:hdrEnd], []byte("\n"))
	body := lines[len(lines)-1]
	body[0] ^= 'A' ^ 'B'
	if body[0] == 0 {
		body[0] = 'C'
	}
	if _, err := age.Decrypt(bytes.NewReader(ct), f); err == nil {
		t.Fatal("a damaged stanza opened")
	}

	b, err := os.ReadFile(filepath.Join("../../../../testdata/auditlog", "auditor.agekey"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := age.ParseIdentities(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewX25519Identity(ids[0].(*age.X25519Identity)); err != nil {
		t.Fatal(err)
	}
}

func TestBech32Decode(t *testing.T) {
	for _, bad := range []string{"", "age", "age1", "AGE1Qyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqs5mdg8q", "age1qyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqs5mdg8b"} {
		if _, _, err := Bech32Decode(bad); err == nil {
			t.Errorf("%q decoded", bad)
		}
	}
	id, _ := age.GenerateX25519Identity()
	hrp, b, err := Bech32Decode(id.Recipient().String())
	if err != nil || hrp != "age" || len(b) != 32 {
		t.Fatalf("%q %x %v", hrp, b, err)
	}
}
