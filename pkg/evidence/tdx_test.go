package evidence

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	tabi "github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	tpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/testing/testdata"
	tverify "github.com/google/go-tdx-guest/verify"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
)

// sampleAt is a time at which the PCK chain of go-tdx-guest's genuine
// sample quote is valid.
var sampleAt = time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)

type tdxFake struct {
	mrtd  []byte
	debug bool
	// qe changes the QE report before the PCK signs it, header the quote
	// header before the attestation key signs it.
	qe     func(*tpb.EnclaveReport)
	header func(*tpb.Header)
}

// fakeTDXQuote builds a complete TDX quote v4 with the given report data:
// the genuine sample quote as template, a fresh attestation key, and a QE
// report signed by a throw-away PCK chain under a fake "Intel SGX Root CA"
// (the PCK leaf reuses the genuine leaf's SGX extension). It returns the quote
// and the fake root in PEM.
func fakeTDXQuote(t testing.TB, rd [64]byte, f tdxFake) ([]byte, []byte) {
	t.Helper()
	q0, err := tabi.QuoteToProto(testdata.RawQuote)
	if err != nil {
		t.Fatal(err)
	}
	q := proto.Clone(q0.(*tpb.QuoteV4)).(*tpb.QuoteV4)
	qerc := q.SignedData.CertificationData.QeReportCertificationData
	blk, _ := pem.Decode(qerc.PckCertificateChainData.PckCertChain)
	realLeaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	var sgxExt pkix.Extension
	for _, e := range realLeaf.Extensions {
		if e.Id.Equal(asn1.ObjectIdentifier(pcs.OidSgxExtension)) {
			sgxExt = e
		}
	}
	mk := func(tmpl, parent *x509.Certificate, pub any, priv *ecdsa.PrivateKey) *x509.Certificate {
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, priv)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c
	}
	name := func(cn string) pkix.Name {
		return pkix.Name{CommonName: cn, Organization: []string{"Intel Corporation"}, Locality: []string{"Santa Clara"}, Province: []string{"CA"}, Country: []string{"US"}}
	}
	rk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ik, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lk, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	nb, na := time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	rt := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: name("Intel SGX Root CA"), NotBefore: nb, NotAfter: na,
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	root := mk(rt, rt, &rk.PublicKey, rk)
	it := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: name("Intel SGX PCK Platform CA"), NotBefore: nb, NotAfter: na,
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	inter := mk(it, root, &ik.PublicKey, rk)
	lt := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: name("Intel SGX PCK Certificate"), NotBefore: nb, NotAfter: na,
		BasicConstraintsValid: true, SubjectKeyId: []byte{1, 2, 3, 4}, KeyUsage: x509.KeyUsageDigitalSignature,
		CRLDistributionPoints: []string{"https://example.invalid/crl"}, ExtraExtensions: []pkix.Extension{sgxExt}}
	leaf := mk(lt, inter, &lk.PublicKey, ik)
	var chain bytes.Buffer
	for _, c := range []*x509.Certificate{leaf, inter, root} {
		pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}

	q.TdQuoteBody.ReportData = rd[:]
	if f.mrtd != nil {
		q.TdQuoteBody.MrTd = f.mrtd
	}
	if f.debug {
		attrs := bytes.Clone(q.TdQuoteBody.TdAttributes)
		attrs[0] |= 1
		q.TdQuoteBody.TdAttributes = attrs
	}
	ak, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	akRaw := make([]byte, 64)
	akPoint, err := ak.PublicKey.Bytes() // 0x04 || X || Y
	if err != nil {
		panic(err)
	}
	copy(akRaw, akPoint[1:])
	q.SignedData.EcdsaAttestationKey = akRaw
	h := sha256.Sum256(append(bytes.Clone(akRaw), qerc.QeAuthData.Data...))
	qerc.QeReport.ReportData = append(h[:], make([]byte, 32)...)
	if f.qe != nil {
		f.qe(qerc.QeReport)
	}
	if f.header != nil {
		f.header(q.Header)
	}
	qeRaw, _ := tabi.EnclaveReportToAbiBytes(qerc.QeReport)
	qerc.QeReportSignature = rawP256Sig(t, lk, qeRaw)
	qerc.PckCertificateChainData.PckCertChain = chain.Bytes()
	qerc.PckCertificateChainData.Size = uint32(chain.Len())
	q.SignedData.CertificationData.Size = uint32(384 + 64 + 2 + len(qerc.QeAuthData.Data) + 6 + chain.Len())
	q.SignedDataSize = 64 + 64 + 6 + q.SignedData.CertificationData.Size
	hdr, _ := tabi.HeaderToAbiBytes(q.Header)
	body, _ := tabi.TdQuoteBodyToAbiBytes(q.TdQuoteBody)
	q.SignedData.Signature = rawP256Sig(t, ak, append(hdr, body...))
	raw, err := tabi.QuoteToAbiBytes(q)
	if err != nil {
		t.Fatal(err)
	}
	return raw, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw})
}

func rawP256Sig(t testing.TB, k *ecdsa.PrivateKey, msg []byte) []byte {
	h := sha256.Sum256(msg)
	r, s, err := ecdsa.Sign(rand.Reader, k, h[:])
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 64)
	r.FillBytes(out[:32])
	s.FillBytes(out[32:])
	return out
}

func tdxBundle(t testing.TB, bd binding, quote []byte) *Bundle {
	t.Helper()
	nb, err := NewBinding(bd.pub, bd.nonce, bd.stmt)
	if err != nil {
		t.Fatal(err)
	}
	return &Bundle{Format: Format, Platform: PlatformTDX, Attested: true, Binding: nb,
		Evidence: &Raw{Type: TypeTDXQuote, Data: quote}, Collector: "test", CollectedAt: time.Now().UTC()}
}

// go-tdx-guest's genuine sample quote verifies against the real Intel root
// embedded in cmcp; its report data is not a cmcp binding.
func TestTDXSampleQuoteRealRoot(t *testing.T) {
	r, err := VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt})
	if err != nil {
		t.Fatal(err)
	}
	if claimStatus(r, ClaimEvidence) != StatusAffirming || claimStatus(r, ClaimRoots) != StatusAffirming {
		t.Fatalf("sample quote: %+v", r.Claims)
	}
	if r.Binding != BindingNotApplicable || claimStatus(r, ClaimBinding) != StatusNone {
		t.Fatalf("raw binding: %s %+v", r.Binding, r.Claims)
	}
	if claimStatus(r, ClaimTCB) != StatusWarning || r.Verdict != StatusWarning || r.Err() != nil {
		t.Fatalf("TCB status must be a warning offline: %+v", r.Claims)
	}
	if r.Report["mr_td"] == "" || !strings.HasPrefix(r.Report["report_data"], "6c62dec1") {
		t.Fatalf("report fields: %v", r.Report)
	}
	file, err := os.ReadFile("../../testdata/evidence/tdx-spr-e4-quote.dat")
	if err != nil || !bytes.Equal(file, testdata.RawQuote) {
		t.Fatalf("testdata copy of the sample quote differs from go-tdx-guest's: %v", err)
	}

	// Wrapped in a cmcp bundle, it is not bound to any key of ours.
	bd := newBinding(t)
	r, _ = Verify(tdxBundle(t, bd, testdata.RawQuote), VerifyOptions{Now: sampleAt})
	if claimStatus(r, ClaimEvidence) != StatusAffirming || r.Binding != BindingMismatch || r.Failure() != FailBinding {
		t.Fatalf("sample quote as our bundle: binding %s %+v", r.Binding, r.Claims)
	}

	// Tampered copies fail.
	for _, off := range []int{48 + 136 /* MRTD */, 48 + 520 /* REPORTDATA */, 700, len(testdata.RawQuote) - 100} {
		bad := bytes.Clone(testdata.RawQuote)
		bad[off] ^= 0x01
		r, _ := VerifyRaw(bad, nil, VerifyOptions{Now: sampleAt})
		if r.Failure() != FailEvidence {
			t.Errorf("tampered byte %d: %+v", off, r.Claims)
		}
	}
	// A truncated quote is malformed evidence.
	r, _ = VerifyRaw(testdata.RawQuote[:1000], nil, VerifyOptions{Now: sampleAt})
	if r.Failure() != FailEvidence {
		t.Fatalf("truncated: %+v", r.Claims)
	}
}

func TestTDXBinding(t *testing.T) {
	bd := newBinding(t)
	mrtd := bytes.Repeat([]byte{0x11}, 48)
	quote, rootPEM := fakeTDXQuote(t, bd.rd, tdxFake{mrtd: mrtd})
	roots, err := ParseRoots(rootPEM, "fake-intel-root.pem")
	if err != nil {
		t.Fatal(err)
	}
	// Every reference value pinned, as the fake quote has them.
	q, err := ParseTDX(quote)
	if err != nil {
		t.Fatal(err)
	}
	body := q.GetTdQuoteBody()
	ref := &ReferenceValues{TDX: &TDXReference{MRTD: []HexBytes{mrtd}, RTMRs: []HexBytes{body.Rtmrs[0], body.Rtmrs[1], body.Rtmrs[2], body.Rtmrs[3]},
		MRConfigID: body.MrConfigId, MRSeam: []HexBytes{body.MrSeam}, TDAttributes: body.TdAttributes, XFAM: body.Xfam}}
	good := VerifyOptions{Roots: roots, Reference: ref, ExpectNonce: bd.nonce, ExpectKey: bd.pub, ExpectStatement: bd.stmt}
	r, _ := Verify(tdxBundle(t, bd, quote), good)
	for _, c := range r.Claims {
		want := StatusAffirming
		if c.Name == ClaimRoots || c.Name == ClaimTCB {
			want = StatusWarning
		}
		if c.Status != want {
			t.Errorf("claim %s = %s (%s), want %s", c.Name, c.Status, c.Reason, want)
		}
	}
	if r.Binding != BindingOurs || r.Verdict != StatusWarning {
		t.Fatalf("binding %s verdict %s", r.Binding, r.Verdict)
	}

	debugQuote, debugRoot := fakeTDXQuote(t, bd.rd, tdxFake{mrtd: mrtd, debug: true})
	debugRoots, _ := ParseRoots(debugRoot, "fake-intel-root.pem")
	tampered := bytes.Clone(quote)
	tampered[48+136] ^= 1 // MRTD
	cases := []struct {
		name    string
		quote   []byte
		opts    VerifyOptions
		claim   string
		failure Failure
		reason  string
	}{
		{"wrong nonce", quote, with(good, func(o *VerifyOptions) { o.ExpectNonce = []byte("other") }), ClaimFreshness, FailBinding, "not the expected nonce"},
		{"wrong key", quote, with(good, func(o *VerifyOptions) { o.ExpectKey = make([]byte, 32) }), ClaimBinding, FailBinding, "not the expected key"},
		{"MRTD not a reference value", quote, with(good, func(o *VerifyOptions) {
			o.Reference = &ReferenceValues{TDX: &TDXReference{MRTD: []HexBytes{bytes.Repeat([]byte{0x22}, 48)}}}
		}), ClaimMeasurement, FailRefValue, "MRTD"},
		{"RTMR mismatch", quote, with(good, func(o *VerifyOptions) {
			o.Reference = &ReferenceValues{TDX: &TDXReference{RTMRs: []HexBytes{nil, bytes.Repeat([]byte{0x22}, 48)}}}
		}), ClaimMeasurement, FailRefValue, "RTMR1"},
		{"debug attribute", debugQuote, with(good, func(o *VerifyOptions) { o.Roots = debugRoots }), ClaimDebug, FailRefValue, "DEBUG"},
		{"tampered MRTD", tampered, good, ClaimEvidence, FailEvidence, "does not verify"},
		{"fake root not pinned", quote, with(good, func(o *VerifyOptions) { o.Roots = nil }), ClaimEvidence, FailEvidence, "of the embedded roots"},
		{"minimum TEE TCB SVN", quote, with(good, func(o *VerifyOptions) {
			o.Reference = &ReferenceValues{TDX: &TDXReference{MinimumTEETCBSVN: bytes.Repeat([]byte{0xff}, 16)}}
		}), ClaimTCB, FailRefValue, "below the minimum"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, _ := Verify(tdxBundle(t, bd, c.quote), c.opts)
			cl := r.Claim(c.claim)
			if cl == nil || cl.Status != StatusContraindicated || cl.Failure != c.failure || !strings.Contains(cl.Reason, c.reason) {
				t.Fatalf("claim %s = %+v, want contraindicated/%s with %q; all %+v", c.claim, cl, c.failure, c.reason, r.Claims)
			}
			if r.Failure() != c.failure {
				t.Fatalf("failure %s", r.Failure())
			}
		})
	}
}

func TestRootsOverride(t *testing.T) {
	if _, err := ParseRoots([]byte("junk"), "x"); err == nil {
		t.Fatal("junk accepted as roots")
	}
	// An Intel-only roots file leaves SEV-SNP with no anchor: no silent fallback.
	bd := newBinding(t)
	_, rootPEM := fakeTDXQuote(t, bd.rd, tdxFake{})
	intelOnly, err := ParseRoots(rootPEM, "intel-only.pem")
	if err != nil {
		t.Fatal(err)
	}
	quote, _, amdPEM := fakeSNPQuote(t, bd.rd, snpFake{})
	r, _ := Verify(snpBundle(t, bd, quote), VerifyOptions{Roots: intelOnly})
	if c := r.Claim(ClaimEvidence); c == nil || !strings.Contains(c.Reason, "no AMD roots in intel-only.pem") {
		t.Fatalf("%+v", r.Claims)
	}
	amdOnly, err := ParseRoots(amdPEM, "amd-only.pem")
	if err != nil {
		t.Fatal(err)
	}
	r, _ = VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Roots: amdOnly, Now: sampleAt})
	if c := r.Claim(ClaimEvidence); c == nil || !strings.Contains(c.Reason, "no Intel root CA in amd-only.pem") {
		t.Fatalf("%+v", r.Claims)
	}
	// The embedded roots name all three AMD product lines and Intel.
	names := strings.Join(Embedded().Names, ", ")
	for _, want := range []string{"ARK-Milan (VCEK and VLEK)", "ARK-Genoa (VCEK and VLEK)", "ARK-Turin (VCEK and VLEK)", "Intel SGX Root CA"} {
		if !strings.Contains(names, want) {
			t.Errorf("embedded roots lack %s: %s", want, names)
		}
	}
}

// TestSoftwareNeverVerifiesAsHardware: software evidence is never
// attested, however it is verified and whatever the bundle says of itself.
// Verified as it is, it is contraindicated; with AllowSoftware it is a
// warning and still not attested; a software bundle whose "attested" was
// edited to true, or that was relabelled sev-snp or tdx without hardware
// evidence, does not decode and verifies as contraindicated, not attested,
// even with AllowSoftware.
func TestSoftwareNeverVerifiesAsHardware(t *testing.T) {
	b := softwareBundle(t)
	r, err := Verify(b, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Attested || r.Verdict != StatusContraindicated || r.Failure() != FailEvidence || r.Binding != BindingOurs {
		t.Fatalf("software: %+v", r)
	}
	r, err = Verify(b, VerifyOptions{AllowSoftware: true, ExpectNonce: b.Binding.Nonce})
	if err != nil {
		t.Fatal(err)
	}
	if r.Attested || r.Platform != PlatformSoftware {
		t.Fatalf("software evidence verified with AllowSoftware is attested: %+v", r)
	}
	if r.Verdict != StatusWarning || claimStatus(r, ClaimEvidence) != StatusWarning || !strings.Contains(r.Claim(ClaimEvidence).Reason, "unattested") {
		t.Fatalf("software allowed: %+v", r.Claims)
	}
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		platform string
		attested bool
		edit     func([]byte) []byte
	}{
		{"attested edited to true", PlatformSoftware, true, func(d []byte) []byte {
			return bytes.Replace(d, []byte(`"attested": false`), []byte(`"attested": true`), 1)
		}},
		{"relabelled sev-snp", PlatformSEVSNP, true, func(d []byte) []byte {
			d = bytes.Replace(d, []byte(`"attested": false`), []byte(`"attested": true`), 1)
			return bytes.Replace(d, []byte(`"platform": "software"`), []byte(`"platform": "sev-snp"`), 1)
		}},
		{"relabelled tdx", PlatformTDX, true, func(d []byte) []byte {
			d = bytes.Replace(d, []byte(`"attested": false`), []byte(`"attested": true`), 1)
			return bytes.Replace(d, []byte(`"platform": "software"`), []byte(`"platform": "tdx"`), 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edited := tc.edit(data)
			if bytes.Equal(edited, data) {
				t.Fatalf("the edit changed nothing in %s", data)
			}
			if _, err := Decode(edited); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode of a software bundle %s: %v, want malformed evidence", tc.name, err)
			}
			lie := softwareBundle(t)
			lie.Platform, lie.Attested = tc.platform, tc.attested
			for _, allow := range []bool{false, true} {
				r, err := Verify(lie, VerifyOptions{AllowSoftware: allow, ExpectNonce: lie.Binding.Nonce})
				if err != nil {
					t.Fatal(err)
				}
				if r.Attested || r.Verdict != StatusContraindicated || r.Failure() != FailEvidence {
					t.Fatalf("software bundle %s (AllowSoftware %v): %+v", tc.name, allow, r)
				}
			}
		})
	}
}

// snpCertTable encodes a GHCB certificate table holding one VCEK.
func snpCertTable(vcek []byte) []byte {
	ct := &abi.CertTable{Entries: []abi.CertTableEntry{{GUID: uuid.MustParse(abi.VcekGUID), RawCert: vcek}}}
	return ct.Marshal()
}

func FuzzVerifyRaw(f *testing.F) {
	f.Add(testdata.RawQuote)
	if raw, err := os.ReadFile("../../testdata/evidence/snp-milan-v2-report.bin"); err == nil {
		f.Add(raw)
	}
	if raw, err := os.ReadFile("../../testdata/evidence/snp-milan-v2-report.bin"); err == nil {
		// With a certificate table (one VCEK entry) behind it.
		vcek, _ := os.ReadFile("../../testdata/evidence/snp-milan-vcek.der")
		f.Add(append(raw, snpCertTable(vcek)...))
	}
	if raw, err := os.ReadFile("../../testdata/evidence/snp-milan-v2-report.bin"); err == nil {
		// A certificate table whose entry range overflows 32 bits.
		f.Add(append(raw, snpCertTableEntry(uuid.MustParse(abi.VcekGUID), 48, 0xffffffff, 100)...))
	}
	f.Add([]byte{4, 0, 2, 0, 0x81, 0, 0, 0})
	f.Add([]byte{3, 0, 0, 0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := VerifyRaw(raw, nil, VerifyOptions{Now: sampleAt})
		if err != nil {
			t.Fatal(err)
		}
		if r.Verdict == StatusAffirming {
			t.Fatal("raw evidence can never be affirming: TCB status and measurements are unchecked")
		}
		_, _ = ParseSNP(raw, nil)
		_, _ = ParseTDX(raw)
	})
}

// TestTDXQuoteFromAForeignQuotingEnclaveIsRefused: a quote whose QE report
// the PCK signed, but whose enclave is not Intel's TD quoting enclave (another
// signer, another product, a debug build) or whose header names another QE
// vendor, is bad evidence. Before, only the signatures were checked (as
// go-tdx-guest does offline, which still accepts every case here), and such a
// quote was affirmed as "PCK chain to the Intel SGX Root CA": any enclave the
// platform runs could certify its own attestation key and sign any TD body.
func TestTDXQuoteFromAForeignQuotingEnclaveIsRefused(t *testing.T) {
	bd := newBinding(t)
	cases := []struct {
		name   string
		fake   tdxFake
		reason string
	}{
		{"another MRSIGNER", tdxFake{qe: func(qe *tpb.EnclaveReport) { qe.MrSigner = bytes.Repeat([]byte{0xee}, 32) }}, "MRSIGNER eeee"},
		{"another ISVPRODID", tdxFake{qe: func(qe *tpb.EnclaveReport) { qe.IsvProdId = 77 }}, "ISVPRODID 77 is not the TD QE's 2"},
		{"debug QE", tdxFake{qe: func(qe *tpb.EnclaveReport) {
			qe.Attributes = bytes.Clone(qe.Attributes)
			qe.Attributes[0] |= 0x02
		}}, "debug enclave"},
		{"another QE vendor", tdxFake{header: func(h *tpb.Header) { h.QeVendorId = bytes.Repeat([]byte{0x11}, 16) }}, "QE vendor 1111"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			quote, rootPEM := fakeTDXQuote(t, bd.rd, c.fake)
			roots, err := ParseRoots(rootPEM, "fake-intel-root.pem")
			if err != nil {
				t.Fatal(err)
			}
			// The forgery is otherwise sound: go-tdx-guest's offline
			// verification accepts it.
			q, err := ParseTDX(quote)
			if err != nil {
				t.Fatal(err)
			}
			if err := tverify.TdxQuote(q, &tverify.Options{TrustedRoots: roots.intel, Now: time.Now()}); err != nil {
				t.Fatalf("go-tdx-guest refuses the fake, the test proves nothing: %v", err)
			}
			for _, r := range []*Result{
				must(Verify(tdxBundle(t, bd, quote), VerifyOptions{Roots: roots, ExpectNonce: bd.nonce, ExpectKey: bd.pub, ExpectStatement: bd.stmt})),
				must(VerifyRaw(quote, nil, VerifyOptions{Roots: roots})),
			} {
				cl := r.Claim(ClaimEvidence)
				if cl == nil || cl.Status != StatusContraindicated || cl.Failure != FailEvidence ||
					!strings.Contains(cl.Reason, "not produced by Intel's TD quoting enclave") && !strings.Contains(cl.Reason, "not Intel") ||
					!strings.Contains(cl.Reason, c.reason) {
					t.Fatalf("evidence claim %+v, want contraindicated/evidence with %q", cl, c.reason)
				}
				if r.Failure() != FailEvidence || r.Err() == nil {
					t.Fatalf("failure %q, err %v", r.Failure(), r.Err())
				}
			}
		})
	}
	// The same fake with Intel's QE untouched verifies, and says whose QE.
	quote, rootPEM := fakeTDXQuote(t, bd.rd, tdxFake{})
	roots, _ := ParseRoots(rootPEM, "fake-intel-root.pem")
	r, _ := VerifyRaw(quote, nil, VerifyOptions{Roots: roots})
	if cl := r.Claim(ClaimEvidence); cl == nil || cl.Status != StatusAffirming || !strings.Contains(cl.Reason, "Intel's TD quoting enclave (MRSIGNER dc9e2a7c6f948f17") {
		t.Fatalf("Intel's QE: %+v", r.Claims)
	}
	if cl := r.Claim(ClaimTCB); cl == nil || cl.Status != StatusWarning || !strings.Contains(cl.Reason, "quoting enclave (ISVSVN 4)") {
		t.Fatalf("the QE's TCB level must be named as not checked: %+v", cl)
	}
}

// TestIntelTDQEIdentityPins holds the pinned identity of Intel's TD quoting
// enclave to the genuine sample quote and to Intel's TD_QE identity as
// recorded from Intel PCS, both shipped in go-tdx-guest's testdata.
func TestIntelTDQEIdentityPins(t *testing.T) {
	q, err := ParseTDX(testdata.RawQuote)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkTDQE(q); err != nil {
		t.Fatalf("genuine sample quote: %v", err)
	}
	if v := q.GetHeader().GetQeVendorId(); !bytes.Equal(v, intelQEVendorID) {
		t.Fatalf("sample QE vendor %x", v)
	}
	var id pcs.QeIdentity
	if err := json.Unmarshal(testdata.QeIdentityBody, &id); err != nil {
		t.Fatal(err)
	}
	ei := id.EnclaveIdentity
	if ei.ID != "TD_QE" || !bytes.Equal(ei.Mrsigner.Bytes, intelTDQEMRSigner) || ei.IsvProdID != intelTDQEProdID {
		t.Fatalf("Intel's TD_QE identity: id %s mrsigner %x isvprodid %d", ei.ID, ei.Mrsigner.Bytes, ei.IsvProdID)
	}
	if len(ei.AttributesMask.Bytes) == 0 || ei.AttributesMask.Bytes[0]&sgxAttrDebug == 0 || ei.Attributes.Bytes[0]&sgxAttrDebug != 0 {
		t.Fatalf("Intel's TD_QE identity does not require DEBUG clear: attributes %x mask %x", ei.Attributes.Bytes, ei.AttributesMask.Bytes)
	}
}

func must(r *Result, err error) *Result {
	if err != nil {
		panic(err)
	}
	return r
}

// TestEvidenceClaimNamesTheRootUsedAndUncheckedRevocation: the evidence
// claim names the root the chain actually ended at and says that revocation
// was not checked. Before, a chain to roots from --roots read "PCK chain to
// the Intel SGX Root CA" or "chain to AMD ARK-Milan", as if cmcp's embedded
// vendor root had been used, and nothing said that no CRL was consulted.
func TestEvidenceClaimNamesTheRootUsedAndUncheckedRevocation(t *testing.T) {
	bd := newBinding(t)
	tdxQuote, tdxRootPEM := fakeTDXQuote(t, bd.rd, tdxFake{})
	tdxRoots, err := ParseRoots(tdxRootPEM, "fake-intel-root.pem")
	if err != nil {
		t.Fatal(err)
	}
	snpQuote, snpRoots, _ := fakeSNPQuote(t, bd.rd, snpFake{})
	intelPEM, err := rootFiles.ReadFile("roots/intel_sgx_root.pem")
	if err != nil {
		t.Fatal(err)
	}
	genuineAgain, err := ParseRoots(intelPEM, "intel-again.pem")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		r       *Result
		want    []string
		mustNot string
	}{
		{"tdx, fake root", must(VerifyRaw(tdxQuote, nil, VerifyOptions{Roots: tdxRoots})),
			[]string{`PCK chain to the root "Intel SGX Root CA" from fake-intel-root.pem (sha256:`, "which is not a root embedded in cmcp"}, "to the Intel SGX Root CA"},
		{"sev-snp, fake roots", must(Verify(snpBundle(t, bd, snpQuote), VerifyOptions{Roots: snpRoots})),
			[]string{`chain to the root "ARK-Milan" from test-roots.pem (sha256:`, "which is not a root embedded in cmcp"}, "AMD ARK-Milan"},
		{"tdx, embedded root", must(VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt})),
			[]string{"PCK chain to the Intel SGX Root CA embedded in cmcp"}, "from"},
		{"tdx, the embedded root given as --roots", must(VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt, Roots: genuineAgain})),
			[]string{`the root "Intel SGX Root CA" from intel-again.pem (sha256:44a0196b2b99f889…fab674d3), the same certificate as the Intel SGX Root CA embedded in cmcp`}, "not a root embedded"},
	} {
		cl := c.r.Claim(ClaimEvidence)
		if cl == nil || cl.Status != StatusAffirming {
			t.Fatalf("%s: %+v", c.name, c.r.Claims)
		}
		for _, w := range append(c.want, "; revocation not checked (offline, no CRL)") {
			if !strings.Contains(cl.Reason, w) {
				t.Errorf("%s: evidence claim %q lacks %q", c.name, cl.Reason, w)
			}
		}
		if strings.Contains(cl.Reason, c.mustNot) {
			t.Errorf("%s: evidence claim %q says %q", c.name, cl.Reason, c.mustNot)
		}
	}
}

// sprQuote is the genuine SPR E4 TDX quote in testdata/evidence.
func sprQuote(t testing.TB) []byte {
	t.Helper()
	q, err := os.ReadFile("../../testdata/evidence/tdx-spr-e4-quote.dat")
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// noPanic runs f and fails the test if it panics.
func noPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("%s panicked: %v", what, p)
		}
	}()
	f()
}

// TestMalformedTDXQuoteLengthsAreBadEvidence: a quote whose signed data
// declares a length that runs past its end (one changed byte: the QE
// authentication data length at offset 1218 set to 0xffff) made go-tdx-guest's
// parser slice out of range, a panic in `cmcp attest verify` and in
// verify-chain before any signature was checked. Each length field of the
// signed data is checked first: the quote is malformed evidence.
func TestMalformedTDXQuoteLengthsAreBadEvidence(t *testing.T) {
	put16 := func(off int, v uint16) func([]byte) []byte {
		return func(q []byte) []byte { binary.LittleEndian.PutUint16(q[off:], v); return q }
	}
	put32 := func(off int, v uint32) func([]byte) []byte {
		return func(q []byte) []byte { binary.LittleEndian.PutUint32(q[off:], v); return q }
	}
	// The sample: signed data of 4299 bytes at 0x27C; certification data
	// header at 764; QE report certification data at 770, its QE auth data
	// length at 1218 (32), the PCK chain header after the auth data.
	qercLen := 4299 - 128 - 6
	cases := []struct {
		name, reason string
		mut          func([]byte) []byte
	}{
		{"QE auth data length 0xffff", "QE authentication data", put16(1218, 0xffff)},
		{"QE auth data leaves no PCK chain header", "QE authentication data", put16(1218, uint16(qercLen-450-3))},
		{"signed data shorter than its fixed part", "signed data", put32(0x278, 10)},
		{"signed data size past the end", "signed data", put32(0x278, 0xffffffff)},
		{"certification data size 0xffffffff", "certification data", put32(766, 0xffffffff)},
		{"certification data too short for a QE report", "certification data", func(q []byte) []byte {
			binary.LittleEndian.PutUint32(q[0x278:], 128+6+100)
			binary.LittleEndian.PutUint32(q[766:], 100)
			return q
		}},
		{"PCK chain size 0xffffffff", "PCK certificate chain", put32(1220+32+2, 0xffffffff)},
	}
	bd := newBinding(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := c.mut(sprQuote(t))
			noPanic(t, "ParseTDX", func() {
				_, err := ParseTDX(q)
				if err == nil || !strings.Contains(err.Error(), "the TDX quote is malformed") || !strings.Contains(err.Error(), c.reason) {
					t.Fatalf("ParseTDX: %v, want malformed with %q", err, c.reason)
				}
			})
			for name, verify := range map[string]func() (*Result, error){
				"VerifyRaw": func() (*Result, error) { return VerifyRaw(q, nil, VerifyOptions{Now: sampleAt}) },
				"Verify": func() (*Result, error) {
					return Verify(tdxBundle(t, bd, q), VerifyOptions{Now: sampleAt, ExpectKey: bd.pub})
				},
			} {
				noPanic(t, name, func() {
					r, err := verify()
					if err != nil {
						t.Fatal(err)
					}
					cl := r.Claim(ClaimEvidence)
					if r.Verdict != StatusContraindicated || r.Failure() != FailEvidence || cl == nil || !strings.Contains(cl.Reason, "the TDX quote is malformed") {
						t.Fatalf("%s: verdict %s, failure %s, evidence %+v", name, r.Verdict, r.Failure(), cl)
					}
				})
			}
		})
	}
}

// TestTDXParserPanicIsAnError: whatever go-tdx-guest's parser does with
// bytes no length check foresaw, a panic in it is an error, not a crash.
func TestTDXParserPanicIsAnError(t *testing.T) {
	err := recoverParse("TDX quote", func() error { panic("runtime error: slice bounds out of range [:65537] with capacity 4165") })
	if err == nil || !strings.Contains(err.Error(), "the TDX quote is malformed") || !strings.Contains(err.Error(), "slice bounds out of range") {
		t.Fatalf("recoverParse: %v", err)
	}
}

// TestAttestedOnlyWhenEvidenceVerified: Result.Attested ("attested" in the
// JSON) is true only for SEV-SNP or TDX evidence that verified (verdict not
// contraindicated). Before, it was true for any evidence claiming a hardware
// platform: three bytes of "TDX quote", or a genuine quote bound to another
// key, were "attested": true next to verdict contraindicated.
func TestAttestedOnlyWhenEvidenceVerified(t *testing.T) {
	bd := newBinding(t)
	fake, rootPEM := fakeTDXQuote(t, bd.rd, tdxFake{})
	fakeRoots, err := ParseRoots(rootPEM, "fake-intel-root.pem")
	if err != nil {
		t.Fatal(err)
	}
	snpRaw, err := os.ReadFile("../../testdata/evidence/snp-milan-v2-report.bin")
	if err != nil {
		t.Fatal(err)
	}
	vcek, err := os.ReadFile("../../testdata/evidence/snp-milan-vcek.der")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		verify   func() (*Result, error)
		attested bool
	}{
		{"tdx bundle of 3 bytes", func() (*Result, error) {
			return Verify(tdxBundle(t, bd, []byte{4, 0, 2}), VerifyOptions{Now: sampleAt})
		}, false},
		{"raw tdx header only", func() (*Result, error) {
			return VerifyRaw([]byte{4, 0, 2, 0, 0x81, 0, 0, 0}, nil, VerifyOptions{Now: sampleAt})
		}, false},
		{"genuine quote bound to another key", func() (*Result, error) {
			return Verify(tdxBundle(t, bd, testdata.RawQuote), VerifyOptions{Now: sampleAt})
		}, false},
		{"verified quote, another key expected", func() (*Result, error) {
			return Verify(tdxBundle(t, bd, fake), VerifyOptions{Roots: fakeRoots, ExpectKey: make([]byte, 32)})
		}, false},
		{"genuine SEV-SNP report of a debug guest", func() (*Result, error) {
			return VerifyRaw(snpRaw, [][]byte{vcek}, VerifyOptions{Now: sampleAt})
		}, false},
		{"software evidence allowed", func() (*Result, error) {
			return Verify(softwareBundle(t), VerifyOptions{AllowSoftware: true})
		}, false},
		{"genuine raw quote", func() (*Result, error) { return VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt}) }, true},
		{"verified bundle", func() (*Result, error) {
			return Verify(tdxBundle(t, bd, fake), VerifyOptions{Roots: fakeRoots, ExpectKey: bd.pub})
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := c.verify()
			if err != nil {
				t.Fatal(err)
			}
			if r.Attested != c.attested || r.Attested != (r.Verdict != StatusContraindicated && r.Platform != PlatformSoftware) {
				t.Fatalf("attested %v, want %v (verdict %s, binding %s)", r.Attested, c.attested, r.Verdict, r.Binding)
			}
			j, _ := json.Marshal(r)
			if want := fmt.Sprintf(`"attested":%v`, c.attested); !strings.Contains(string(j), want) {
				t.Fatalf("JSON %s lacks %s", j, want)
			}
		})
	}
}
