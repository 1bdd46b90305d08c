package evidence

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

func softwareBundle(t testing.TB) *Bundle {
	t.Helper()
	pub := ed25519.PublicKey(bytes.Repeat([]byte{7}, 32))
	b, err := NewBinding(pub, []byte("nonce-123"), digest.Bytes([]byte("stmt")))
	if err != nil {
		t.Fatal(err)
	}
	return &Bundle{Format: Format, Platform: PlatformSoftware, Note: SoftwareLabel, Binding: b,
		Collector: "software", CollectedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func TestBundleRoundTrip(t *testing.T) {
	b := softwareBundle(t)
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"format": "cmcp-evidence/v1"`, `"platform": "software"`, `"attested": false`, `"nonce": "6e6f6e63652d313233"`, `"statement": "sha256:`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("bundle lacks %s:\n%s", want, data)
		}
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := got.Marshal()
	if !bytes.Equal(again, data) {
		t.Fatalf("round trip differs:\n%s\n%s", data, again)
	}
	path := filepath.Join(t.TempDir(), "ev.json")
	if err := WriteFile(path, b); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := softwareBundle(t).Marshal()
	cases := []struct{ name, from, to, want string }{
		{"format", `cmcp-evidence/v1`, `cmcp-evidence/v9`, "format"},
		{"platform", `"platform": "software"`, `"platform": "sgx"`, "platform"},
		{"attested software", `"attested": false`, `"attested": true`, "attested"},
		{"unknown member", `"format"`, `"extra": 1, "format"`, `unknown object member name "extra"`},
		{"label removed", SoftwareLabel, "fine", "note"},
		{"short key", `"public_key": "`, `"public_key": "AAAA`, "public_key"},
		{"bad hex nonce", `"nonce": "6e`, `"nonce": "zz`, "hex"},
		{"bad statement", `"statement": "sha256:`, `"statement": "md5:`, "algorithm"},
		{"trailing", "}\n", "}{}", "trailing"},
		{"software with evidence", `"collector"`, `"evidence": {"type": "x", "data": "AA=="}, "collector"`, "no hardware"},
		// encoding/json alone keeps the last duplicate: a bundle saying
		// "tdx" to one parser and "software" to another.
		{"duplicate member", `"platform": "software"`, `"platform": "tdx", "platform": "software"`, "duplicate"},
		{"duplicate nested member", `"nonce": "`, `"nonce": "00", "nonce": "`, "duplicate"},
		{"invalid UTF-8", `"note": "`, "\"note\": \"\xff", "UTF-8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad := strings.Replace(string(good), c.from, c.to, 1)
			if bad == string(good) && c.name != "trailing" {
				t.Fatalf("replacement %q did not apply", c.from)
			}
			_, err := Decode([]byte(bad))
			if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Decode = %v, want ErrMalformed mentioning %q", err, c.want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	good, _ := softwareBundle(f).Marshal()
	f.Add(good)
	if data, err := os.ReadFile("testdata/snp-bundle.json"); err == nil {
		f.Add(data)
	}
	if data, err := os.ReadFile("testdata/tdx-bundle.json"); err == nil {
		f.Add(data)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"format":"cmcp-evidence/v1","platform":"tdx","attested":true}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		out, err := b.Marshal()
		if err != nil {
			t.Fatalf("decoded bundle does not marshal: %v", err)
		}
		b2, err := Decode(out)
		if err != nil {
			t.Fatalf("re-encoded bundle does not decode: %v", err)
		}
		out2, _ := b2.Marshal()
		if !bytes.Equal(out, out2) {
			t.Fatal("encoding is not stable")
		}
	})
}

// TestBundleAndReferenceNamesAreCaseSensitive: member names must be spelled
// exactly. Before, encoding/json matched them case-insensitively (and by
// Unicode folding): "FORMAT" was read as format, and a "Nonce" after
// "nonce" passed the duplicate check and replaced the nonce that a
// case-sensitive reader of the same bundle sees.
func TestBundleAndReferenceNamesAreCaseSensitive(t *testing.T) {
	good, _ := softwareBundle(t).Marshal()
	for _, c := range []struct{ name, from, to, want string }{
		{"upper-case name", `"format"`, `"FORMAT"`, `unknown object member name "FORMAT"`},
		{"case variant after the name", `"nonce": "6e6f6e63652d313233",`, `"nonce": "6e6f6e63652d313233", "Nonce": "deadbeef",`, `unknown object member name "Nonce"`},
		{"case variant before the name", `"nonce": "6e6f6e63652d313233",`, `"Nonce": "deadbeef", "nonce": "6e6f6e63652d313233",`, `unknown object member name "Nonce"`},
		{"Kelvin sign folds to k", `"key_alg"`, `"\u212aey_alg"`, "unknown object member name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := strings.Replace(string(good), c.from, c.to, 1)
			if bad == string(good) {
				t.Fatalf("replacement %q did not apply", c.from)
			}
			b, err := Decode([]byte(bad))
			if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				var nonce string
				if b != nil {
					nonce = string(b.Binding.Nonce)
				}
				t.Fatalf("Decode = %v (nonce %q), want ErrMalformed mentioning %q", err, nonce, c.want)
			}
		})
	}
	m, other := strings.Repeat("ab", 48), strings.Repeat("cd", 48)
	for _, bad := range []string{
		`{"TDX": {"mr_td": ["` + m + `"]}}`,
		`{"tdx": {"MR_TD": ["` + m + `"]}}`,
		`{"sev-snp": {"measurements": ["` + m + `"], "Measurements": ["` + other + `"]}}`,
	} {
		if _, err := ParseReferenceValues([]byte(bad)); err == nil || !strings.Contains(err.Error(), "unknown object member name") {
			t.Errorf("%s: %v, want refused", bad, err)
		}
	}
}
