package evidence

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	sverify "github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"
	"github.com/google/go-tdx-guest/testing/testdata"
	tverify "github.com/google/go-tdx-guest/verify"
)

// cmcp checks vendor signatures and chains itself, so that pkg/evidence
// links no network code (the vendor verify packages carry KDS/PCS fetchers).
// These tests hold its verdicts to the vendor libraries' verify packages on
// genuine, forged and tampered evidence: both accept or both reject.

func libSNP(raw []byte, extra [][]byte, roots *Roots, now time.Time) error {
	att, err := ParseSNP(raw, extra)
	if err != nil {
		return err
	}
	tr := map[string][]*trust.AMDRootCerts{}
	for line, a := range roots.amd {
		r := trust.AMDRootCertsProduct(line)
		r.ProductCerts = &trust.ProductCerts{Ark: a.ark, Ask: a.ask, Asvk: a.asvk}
		tr[line] = []*trust.AMDRootCerts{r}
	}
	return sverify.SnpAttestation(att, &sverify.Options{TrustedRoots: tr, DisableCertFetching: true, Now: now})
}

func ours(raw []byte, extra [][]byte, roots *Roots, now time.Time) bool {
	r := &Result{}
	o := VerifyOptions{Roots: roots, Now: now}
	switch DetectRaw(raw) {
	case PlatformSEVSNP:
		verifySNP(r, raw, extra, &o)
	case PlatformTDX:
		verifyTDX(r, raw, &o)
	default:
		return false
	}
	c := r.Claim(ClaimEvidence)
	return c != nil && c.Status == StatusAffirming
}

func flips(raw []byte, offsets ...int) [][]byte {
	var out [][]byte
	for _, off := range offsets {
		if off < len(raw) {
			b := bytes.Clone(raw)
			b[off] ^= 0x01
			out = append(out, b)
		}
	}
	return out
}

func TestCrossCheckSNPWithGoSevGuest(t *testing.T) {
	bd := newBinding(t)
	fake, fakeRoots, _ := fakeSNPQuote(t, bd.rd, snpFake{})
	vlek, vlekRoots, _ := fakeSNPQuote(t, bd.rd, snpFake{vlek: true})
	genuine, _ := os.ReadFile("../../testdata/evidence/snp-milan-v2-report.bin")
	vcek, _ := os.ReadFile("../../testdata/evidence/snp-milan-vcek.der")
	at := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	type tc struct {
		name  string
		raw   []byte
		extra [][]byte
		roots *Roots
		now   time.Time
	}
	cases := []tc{
		{"fake", fake, nil, fakeRoots, time.Now()},
		{"fake, embedded roots", fake, nil, Embedded(), time.Now()},
		{"fake VLEK", vlek, nil, vlekRoots, time.Now()},
		{"fake VLEK, VCEK roots of another chain", vlek, nil, fakeRoots, time.Now()},
		{"genuine Milan", genuine, [][]byte{vcek}, Embedded(), at},
		{"genuine Milan, fake roots", genuine, [][]byte{vcek}, fakeRoots, at},
		{"genuine Milan, after the VCEK expired", genuine, [][]byte{vcek}, Embedded(), time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	for i, b := range flips(fake, 0x08, 0x50, 0x90, 0xC0, 0x180, 0x2A0, 0x2B0, abi.ReportSize+40, abi.ReportSize+500) {
		cases = append(cases, tc{"fake flipped " + string(rune('a'+i)), b, nil, fakeRoots, time.Now()})
	}
	for i, b := range flips(genuine, 0x08, 0x38, 0x90, 0x1A0, 0x2A0, 0x300) {
		cases = append(cases, tc{"genuine flipped " + string(rune('a'+i)), b, [][]byte{vcek}, Embedded(), at})
	}
	accepted := 0
	for _, c := range cases {
		lib := libSNP(c.raw, c.extra, c.roots, c.now) == nil
		if got := ours(c.raw, c.extra, c.roots, c.now); got != lib {
			t.Errorf("%s: cmcp accepts=%v, go-sev-guest accepts=%v (%v)", c.name, got, lib, libSNP(c.raw, c.extra, c.roots, c.now))
		}
		if lib {
			accepted++
		}
	}
	if accepted < 3 {
		t.Fatalf("only %d cases accepted: the cross-check is vacuous", accepted)
	}
}

func TestCrossCheckTDXWithGoTdxGuest(t *testing.T) {
	bd := newBinding(t)
	fake, rootPEM := fakeTDXQuote(t, bd.rd, tdxFake{})
	fakeRoots, _ := ParseRoots(rootPEM, "fake.pem")
	lib := func(raw []byte, roots *Roots, now time.Time) bool {
		q, err := ParseTDX(raw)
		if err != nil {
			return false
		}
		return tverify.TdxQuote(q, &tverify.Options{TrustedRoots: roots.intel, Now: now}) == nil
	}
	type tc struct {
		name  string
		raw   []byte
		roots *Roots
		now   time.Time
	}
	cases := []tc{
		{"sample", testdata.RawQuote, Embedded(), sampleAt},
		{"sample, fake root", testdata.RawQuote, fakeRoots, sampleAt},
		{"sample, long after", testdata.RawQuote, Embedded(), time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"forged", fake, fakeRoots, time.Now()},
		{"forged, embedded root", fake, Embedded(), time.Now()},
	}
	for i, b := range flips(testdata.RawQuote, 2, 10, 48+16, 48+136, 48+520, 48+584+4, 700, 800, 1100, 1500, len(testdata.RawQuote)-200) {
		cases = append(cases, tc{"sample flipped " + string(rune('a'+i)), b, Embedded(), sampleAt})
	}
	for i, b := range flips(fake, 48+136, 48+520, 700, 900) {
		cases = append(cases, tc{"forged flipped " + string(rune('a'+i)), b, fakeRoots, time.Now()})
	}
	accepted := 0
	for _, c := range cases {
		l := lib(c.raw, c.roots, c.now)
		if got := ours(c.raw, nil, c.roots, c.now); got != l {
			t.Errorf("%s: cmcp accepts=%v, go-tdx-guest accepts=%v", c.name, got, l)
		}
		if l {
			accepted++
		}
	}
	if accepted < 2 {
		t.Fatalf("only %d cases accepted: the cross-check is vacuous", accepted)
	}
}
