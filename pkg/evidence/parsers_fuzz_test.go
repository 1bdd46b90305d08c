package evidence

import (
	"bytes"
	"crypto/ed25519"
	"os"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/testing/testdata"
	tverify "github.com/google/go-tdx-guest/verify"
)

func FuzzParseReferenceValues(f *testing.F) {
	f.Add([]byte(`{"sev-snp": {"measurements": ["` + string(bytes.Repeat([]byte("ab"), 48)) + `"], "minimum_tcb": {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115}, "allow_smt": false, "vmpl": 0}}`))
	f.Add([]byte(`{"tdx": {"mr_td": ["` + string(bytes.Repeat([]byte("00"), 48)) + `"], "rtmrs": ["", "` + string(bytes.Repeat([]byte("11"), 48)) + `"], "minimum_tee_tcb_svn": "` + string(bytes.Repeat([]byte("01"), 16)) + `"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rv, err := ParseReferenceValues(data)
		if err != nil {
			return
		}
		if rv.SEVSNP == nil && rv.TDX == nil {
			t.Fatal("accepted reference values with no section")
		}
		if s := rv.SEVSNP; s != nil {
			for _, m := range s.Measurements {
				if len(m) != 48 {
					t.Fatalf("accepted a %d-byte measurement", len(m))
				}
			}
		}
	})
}

func FuzzParsePublicKey(f *testing.F) {
	pub := ed25519.PublicKey(bytes.Repeat([]byte{9}, 32))
	f.Add([]byte(FormatPublicKey(pub)))
	f.Add([]byte(pub))
	f.Add([]byte("-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEACQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=\n-----END PUBLIC KEY-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParsePublicKey(data)
		if err == nil && len(k) != ed25519.PublicKeySize {
			t.Fatalf("accepted a %d-byte key", len(k))
		}
	})
}

func FuzzParseRoots(f *testing.F) {
	for _, name := range []string{"roots/amd_milan_vcek.pem", "roots/amd_turin_vlek.pem", "roots/intel_sgx_root.pem"} {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRoots(data, "fuzz")
		if err != nil {
			return
		}
		for line, a := range r.amd {
			if a.ark == nil || (a.ask == nil && a.asvk == nil) {
				t.Fatalf("incomplete AMD roots for %s accepted", line)
			}
		}
	})
}

// Verification cost, cmcp's own chain and signature checks against the
// vendor library's, on the genuine TDX sample quote (ratio in the report).
func BenchmarkVerifyTDXQuote(b *testing.B) {
	roots := Embedded()
	b.Run("cmcp", func(b *testing.B) {
		for b.Loop() {
			r, _ := VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Roots: roots, Now: sampleAt})
			if r.Claim(ClaimEvidence).Status != StatusAffirming {
				b.Fatal("rejected")
			}
		}
	})
	b.Run("go-tdx-guest", func(b *testing.B) {
		for b.Loop() {
			q, _ := ParseTDX(testdata.RawQuote)
			if err := tverify.TdxQuote(q, &tverify.Options{TrustedRoots: roots.intel, Now: sampleAt}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkVerifySNPReport(b *testing.B) {
	raw, _ := os.ReadFile("../../testdata/evidence/snp-milan-v2-report.bin")
	vcek, _ := os.ReadFile("../../testdata/evidence/snp-milan-vcek.der")
	roots := Embedded()
	at := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	b.Run("cmcp", func(b *testing.B) {
		for b.Loop() {
			r, _ := VerifyRaw(raw, [][]byte{vcek}, VerifyOptions{Roots: roots, Now: at})
			if r.Claim(ClaimEvidence).Status != StatusAffirming {
				b.Fatal("rejected")
			}
		}
	})
	b.Run("go-sev-guest", func(b *testing.B) {
		for b.Loop() {
			if err := libSNP(raw, [][]byte{vcek}, roots, at); err != nil {
				b.Fatal(err)
			}
		}
	})
}
