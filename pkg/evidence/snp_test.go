package evidence

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	labi "github.com/google/go-sev-guest/client/linuxabi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	stest "github.com/google/go-sev-guest/testing"
	"github.com/google/uuid"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// The go-sev-guest fakes share an unsynchronised math/rand: these tests
// never run in parallel.

const milanFMS = 0x00a00f10

var fakeTCB = kds.TCBParts{BlSpl: 3, TeeSpl: 0, SnpSpl: 8, UcodeSpl: 115}

// fakeGuestSVN is the GUEST_SVN of the fake reports (VMPL is 0).
const fakeGuestSVN = 2

type snpFake struct {
	debug, migrateMA bool
	measurement      []byte
	hostData         []byte
	vlek             bool
}

// fakeSNPQuote has go-sev-guest's fake AMD secure processor sign a report
// with the given report data, and returns report || certificate table and
// the fake ARK/ASK/ASVK as roots.
func fakeSNPQuote(t testing.TB, rd [64]byte, f snpFake) ([]byte, *Roots, []byte) {
	t.Helper()
	tcbv, err := kds.ComposeTCBParts(fakeTCB)
	if err != nil {
		t.Fatal(err)
	}
	hwid := bytes.Repeat([]byte{0x42}, 64)
	now := time.Now()
	b := &stest.AmdSignerBuilder{
		ProductName: "Milan-B0", CSPID: "cmcp-test",
		ArkCreationTime: now, AskCreationTime: now, AsvkCreationTime: now, VcekCreationTime: now, VlekCreationTime: now,
		VcekCustom: stest.CertOverride{Extensions: stest.CustomExtensions(fakeTCB, hwid, "", "Milan-B0")},
		VlekCustom: stest.CertOverride{Extensions: stest.CustomExtensions(fakeTCB, nil, "cmcp-test", "Milan-B0")},
	}
	signer, err := b.TestOnlyCertChain()
	if err != nil {
		t.Fatal(err)
	}
	meas := f.measurement
	if meas == nil {
		meas = bytes.Repeat([]byte{0xab}, 48)
	}
	host := f.hostData
	if host == nil {
		host = make([]byte, 32)
	}
	chip := hwid
	signerInfo := abi.SignerInfo{SigningKey: abi.VcekReportSigner}
	if f.vlek {
		chip = make([]byte, 64)
		signerInfo.SigningKey = abi.VlekReportSigner
	}
	rep := &spb.Report{
		Version: 3, Policy: abi.SnpPolicyToBytes(abi.SnpPolicy{SMT: true, Debug: f.debug, MigrateMA: f.migrateMA}),
		SignatureAlgo: abi.SignEcdsaP384Sha384, ReportData: rd[:], Measurement: meas, HostData: host,
		FamilyId: make([]byte, 16), ImageId: make([]byte, 16), IdKeyDigest: make([]byte, 48),
		AuthorKeyDigest: make([]byte, 48), ReportId: make([]byte, 32), ReportIdMa: make([]byte, 32),
		ChipId: chip, Signature: make([]byte, 512), Cpuid1EaxFms: milanFMS, SignerInfo: abi.ComposeSignerInfo(signerInfo),
		GuestSvn:    fakeGuestSVN,
		ReportedTcb: uint64(tcbv), CurrentTcb: uint64(tcbv), CommittedTcb: uint64(tcbv), LaunchTcb: uint64(tcbv),
	}
	raw, err := abi.ReportToAbiBytes(rep)
	if err != nil {
		t.Fatal(err)
	}
	var out [labi.SnpReportRespReportSize]byte
	copy(out[:], raw)
	tc := stest.TestCase{Name: "cmcp", Input: rd, Output: out}
	if f.vlek {
		tc.EK = stest.KeyChoiceVlek
	}
	qp, err := stest.TcQuoteProvider([]stest.TestCase{tc},
		&stest.DeviceOptions{Signer: signer, Now: now, Product: abi.SevProductFromCpuid1Eax(milanFMS)})
	if err != nil {
		t.Fatal(err)
	}
	quote, err := qp.GetRawQuote(rd)
	if err != nil {
		t.Fatal(err)
	}
	var pemRoots bytes.Buffer
	for _, c := range [][]byte{signer.Ark.Raw, signer.Ask.Raw, signer.Asvk.Raw} {
		pem.Encode(&pemRoots, &pem.Block{Type: "CERTIFICATE", Bytes: c})
	}
	roots, err := ParseRoots(pemRoots.Bytes(), "test-roots.pem")
	if err != nil {
		t.Fatal(err)
	}
	return quote, roots, pemRoots.Bytes()
}

type binding struct {
	pub   ed25519.PublicKey
	nonce []byte
	stmt  digest.Digest
	rd    [64]byte
}

func newBinding(t testing.TB) binding {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	b := binding{pub: pub, nonce: []byte("auditor-nonce-0001"), stmt: digest.Bytes([]byte("genesis body"))}
	var err error
	if b.rd, err = ReportData(b.pub, b.nonce, b.stmt); err != nil {
		t.Fatal(err)
	}
	return b
}

func snpBundle(t testing.TB, bd binding, quote []byte) *Bundle {
	t.Helper()
	nb, err := NewBinding(bd.pub, bd.nonce, bd.stmt)
	if err != nil {
		t.Fatal(err)
	}
	return &Bundle{Format: Format, Platform: PlatformSEVSNP, Attested: true, Binding: nb,
		Evidence: &Raw{Type: TypeSNPReport, Data: quote}, Collector: "test", CollectedAt: time.Now().UTC()}
}

// snpRef pins every reference value of the fake reports.
var snpRef = &ReferenceValues{SEVSNP: &SNPReference{
	Measurements:    []HexBytes{bytes.Repeat([]byte{0xab}, 48)},
	HostData:        make([]byte, 32),
	MinimumTCB:      &SNPTCB{Bootloader: 3, SNP: 8, Microcode: 100},
	MinimumGuestSVN: fakeGuestSVN,
	VMPL:            new(uint32),
}}

func claimStatus(r *Result, name string) Status {
	if c := r.Claim(name); c != nil {
		return c.Status
	}
	return ""
}

func TestSNPEndToEnd(t *testing.T) {
	bd := newBinding(t)
	quote, roots, _ := fakeSNPQuote(t, bd.rd, snpFake{})
	b := snpBundle(t, bd, quote)
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	b, err = Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	good := VerifyOptions{Roots: roots, Reference: snpRef, ExpectNonce: bd.nonce, ExpectKey: bd.pub, ExpectStatement: bd.stmt}
	r, err := Verify(b, good)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Claims {
		want := StatusAffirming
		switch c.Name {
		case ClaimRoots:
			want = StatusWarning // test roots replace the embedded ones
		case ClaimTCB:
			want = StatusWarning // meets the minimum, but currency is not established offline
		}
		if c.Status != want {
			t.Errorf("claim %s = %s (%s), want %s", c.Name, c.Status, c.Reason, want)
		}
	}
	if r.Verdict != StatusWarning || r.Binding != BindingOurs || r.Err() != nil {
		t.Fatalf("verdict %s binding %s err %v", r.Verdict, r.Binding, r.Err())
	}
	for _, want := range []string{ClaimEvidence, ClaimBinding, ClaimFreshness, ClaimDebug, ClaimPolicy, ClaimMeasurement, ClaimHostData, ClaimTCB} {
		if r.Claim(want) == nil {
			t.Errorf("no %s claim", want)
		}
	}
}

func TestSNPRejections(t *testing.T) {
	bd := newBinding(t)
	quote, roots, _ := fakeSNPQuote(t, bd.rd, snpFake{})
	base := VerifyOptions{Roots: roots, Reference: snpRef, ExpectNonce: bd.nonce, ExpectKey: bd.pub, ExpectStatement: bd.stmt}
	other, _, _ := ed25519.GenerateKey(rand.Reader)

	debugQuote, debugRoots, _ := fakeSNPQuote(t, bd.rd, snpFake{debug: true})
	maQuote, maRoots, _ := fakeSNPQuote(t, bd.rd, snpFake{migrateMA: true})

	tampered := bytes.Clone(quote)
	tampered[0x90] ^= 1 // MEASUREMENT

	// The bundle claims another nonce than the one the hardware signed.
	forged := snpBundle(t, bd, quote)
	forged.Binding, _ = NewBinding(bd.pub, []byte("other nonce"), bd.stmt)

	cases := []struct {
		name    string
		bundle  *Bundle
		opts    VerifyOptions
		claim   string
		failure Failure
		reason  string
	}{
		{"wrong nonce", snpBundle(t, bd, quote), with(base, func(o *VerifyOptions) { o.ExpectNonce = []byte("fresh-nonce") }), ClaimFreshness, FailBinding, "not the expected nonce"},
		{"wrong key", snpBundle(t, bd, quote), with(base, func(o *VerifyOptions) { o.ExpectKey = other }), ClaimBinding, FailBinding, "not the expected key"},
		{"other statement", snpBundle(t, bd, quote), with(base, func(o *VerifyOptions) { o.ExpectStatement = digest.Bytes([]byte("x")) }), ClaimBinding, FailBinding, "not the expected sha256:"},
		{"bundle binding not the signed one", forged, base, ClaimBinding, FailBinding, "is not the binding"},
		{"tampered measurement", snpBundle(t, bd, tampered), base, ClaimEvidence, FailEvidence, "signature"},
		{"measurement not a reference value", snpBundle(t, bd, quote), with(base, func(o *VerifyOptions) {
			o.Reference = &ReferenceValues{SEVSNP: &SNPReference{Measurements: []HexBytes{bytes.Repeat([]byte{0xcd}, 48)}}}
		}), ClaimMeasurement, FailRefValue, "not among"},
		{"host data", snpBundle(t, bd, quote), with(base, func(o *VerifyOptions) {
			o.Reference = &ReferenceValues{SEVSNP: &SNPReference{HostData: bytes.Repeat([]byte{1}, 32)}}
		}), ClaimHostData, FailRefValue, "HOST_DATA"},
		{"debug policy", snpBundle(t, bd, debugQuote), with(base, func(o *VerifyOptions) {
			o.Roots = debugRoots
			o.Reference = &ReferenceValues{SEVSNP: &SNPReference{AllowMigrateMA: true}} // nothing in the file can allow debug
		}), ClaimDebug, FailRefValue, "allows debugging"},
		{"migration agent", snpBundle(t, bd, maQuote), with(base, func(o *VerifyOptions) { o.Roots = maRoots }), ClaimPolicy, FailRefValue, "migration agent"},
		{"below minimum TCB", snpBundle(t, bd, quote), with(base, func(o *VerifyOptions) {
			o.Reference = &ReferenceValues{SEVSNP: &SNPReference{MinimumTCB: &SNPTCB{Bootloader: 3, SNP: 22, Microcode: 100}}}
		}), ClaimTCB, FailRefValue, "snp 8 < 22"},
		{"chain to a root that is not pinned", snpBundle(t, bd, quote), with(base, func(o *VerifyOptions) { o.Roots = nil }), ClaimEvidence, FailEvidence, "of the embedded roots"},
		{"truncated report", snpBundle(t, bd, quote[:1000]), base, ClaimEvidence, FailEvidence, "truncated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Verify(c.bundle, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			cl := r.Claim(c.claim)
			if cl == nil || cl.Status != StatusContraindicated || cl.Failure != c.failure || !strings.Contains(cl.Reason, c.reason) {
				t.Fatalf("claim %s = %+v, want contraindicated/%s with %q; all: %+v", c.claim, cl, c.failure, c.reason, r.Claims)
			}
			if r.Verdict != StatusContraindicated || r.Failure() != c.failure {
				t.Fatalf("verdict %s failure %s", r.Verdict, r.Failure())
			}
			if err := r.Err(); err == nil || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("Err() = %v", err)
			}
		})
	}
}

func with(o VerifyOptions, f func(*VerifyOptions)) VerifyOptions {
	f(&o)
	return o
}

func TestSNPVLEK(t *testing.T) {
	bd := newBinding(t)
	quote, roots, _ := fakeSNPQuote(t, bd.rd, snpFake{vlek: true})
	r, err := Verify(snpBundle(t, bd, quote), VerifyOptions{Roots: roots, ExpectNonce: bd.nonce})
	if err != nil {
		t.Fatal(err)
	}
	if claimStatus(r, ClaimEvidence) != StatusAffirming || r.Report["signer"] != "VLEK" {
		t.Fatalf("VLEK evidence: %+v", r.Claims)
	}
}

// The raw report and VCEK shipped in go-sev-guest's testdata: a genuine Milan
// version 2 report, signed by a VCEK that chains to the real AMD ARK-Milan.
// Its guest policy allows debugging, which cmcp always rejects.
func TestSNPGenuineRawReport(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/evidence/snp-milan-v2-report.bin")
	if err != nil {
		t.Fatal(err)
	}
	vcek, err := os.ReadFile("../../testdata/evidence/snp-milan-vcek.der")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	r, err := VerifyRaw(raw, [][]byte{vcek}, VerifyOptions{Now: at})
	if err != nil {
		t.Fatal(err)
	}
	if claimStatus(r, ClaimEvidence) != StatusAffirming || r.Binding != BindingNotApplicable || claimStatus(r, ClaimBinding) != StatusNone {
		t.Fatalf("genuine report: %+v", r.Claims)
	}
	if claimStatus(r, ClaimDebug) != StatusContraindicated || r.Failure() != FailRefValue {
		t.Fatalf("debug-enabled genuine report not rejected: %+v", r.Claims)
	}
	if r.Report["product_line"] != "Milan" {
		t.Errorf("product line %q", r.Report["product_line"])
	}
	// Without the VCEK the chain cannot be checked offline.
	r, _ = VerifyRaw(raw, nil, VerifyOptions{Now: at})
	if c := r.Claim(ClaimEvidence); c == nil || c.Status != StatusContraindicated || !strings.Contains(c.Reason, "--cert") {
		t.Fatalf("no VCEK: %+v", r.Claims)
	}
	// A certificate that does not parse (a damaged VCEK, a PEM with garbage,
	// an empty file) is bad evidence, reported as a claim: not an error of
	// the caller.
	badVCEK := bytes.Clone(vcek)
	badVCEK[100] ^= 0xff
	for name, c := range map[string][]byte{"damaged DER": badVCEK, "PEM garbage": []byte("-----BEGIN CERTIFICATE-----\ngarbage!!\n-----END CERTIFICATE-----\n"), "empty": nil} {
		r, err := VerifyRaw(raw, [][]byte{vcek, c}, VerifyOptions{Now: at})
		if err != nil {
			t.Fatalf("%s certificate: error %v, want a contraindicated evidence claim", name, err)
		}
		if c := r.Claim(ClaimEvidence); r.Failure() != FailEvidence || c == nil || !strings.Contains(c.Reason, "certificate 2 of 2") {
			t.Fatalf("%s certificate: %+v", name, r.Claims)
		}
	}
	// Tampered copies fail the signature.
	for _, off := range []int{0x08, 0x50, 0x90, 0xC0, 0x2A0} {
		bad := bytes.Clone(raw)
		bad[off] ^= 0x01
		r, _ := VerifyRaw(bad, [][]byte{vcek}, VerifyOptions{Now: at})
		if r.Failure() != FailEvidence {
			t.Errorf("tampered byte 0x%x: %+v", off, r.Claims)
		}
	}
}

// snpCertTableEntry encodes a GHCB certificate table with one entry claiming
// bytes [offset, offset+length) and n bytes of data after the table.
func snpCertTableEntry(guid uuid.UUID, offset, length uint32, n int) []byte {
	b := make([]byte, 0, 48+n)
	b = append(b, guid[:]...)
	b = binary.LittleEndian.AppendUint32(b, offset)
	b = binary.LittleEndian.AppendUint32(b, length)
	b = append(b, make([]byte, 24+n)...)
	return b
}

// TestSNPCertTableOutOfRange: a certificate table entry whose offset plus
// length overflows 32 bits made go-sev-guest slice out of range (a panic in
// cmcp attest verify); it is bad evidence.
func TestSNPCertTableOutOfRange(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/evidence/snp-milan-v2-report.bin")
	if err != nil {
		t.Fatal(err)
	}
	vcek := uuid.MustParse(abi.VcekGUID)
	for name, table := range map[string][]byte{
		"length overflows": snpCertTableEntry(vcek, 48, 0xffffffff, 100),
		"offset overflows": snpCertTableEntry(vcek, 0xfffffff0, 100, 100),
		"beyond the data":  snpCertTableEntry(vcek, 48, 1000, 100),
	} {
		ev := append(bytes.Clone(raw), table...)
		if _, err := ParseSNP(ev, nil); err == nil || !strings.Contains(err.Error(), "certificate table") {
			t.Errorf("%s: ParseSNP = %v", name, err)
		}
		r, err := VerifyRaw(ev, nil, VerifyOptions{Now: time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)})
		if err != nil || r.Failure() != FailEvidence {
			t.Errorf("%s: VerifyRaw = %v, %+v", name, err, r)
		}
	}
}

// TestSNPRawReportV3WithSeparateVCEK: a raw version 3 report (the fake
// secure processor's) on its own, with its VCEK given separately in PEM or
// DER as `cmcp attest verify --raw-report R --cert C` does, verifies with
// the binding not applicable; without the VCEK it cannot be checked.
func TestSNPRawReportV3WithSeparateVCEK(t *testing.T) {
	bd := newBinding(t)
	quote, roots, _ := fakeSNPQuote(t, bd.rd, snpFake{})
	att, err := ParseSNP(quote, nil)
	if err != nil {
		t.Fatal(err)
	}
	if att.GetReport().GetVersion() != 3 {
		t.Fatalf("fake report version %d, want 3", att.GetReport().GetVersion())
	}
	vcekDER := att.GetCertificateChain().GetVcekCert()
	vcekPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: vcekDER})
	report := quote[:abi.ReportSize]
	for name, cert := range map[string][]byte{"DER": vcekDER, "PEM": vcekPEM} {
		r, err := VerifyRaw(report, [][]byte{cert}, VerifyOptions{Roots: roots, Reference: snpRef})
		if err != nil {
			t.Fatal(err)
		}
		if r.Verdict != StatusAffirming && r.Verdict != StatusWarning || r.Err() != nil {
			t.Fatalf("v3 report, VCEK in %s: %s %+v", name, r.Verdict, r.Claims)
		}
		if c := r.Claim(ClaimEvidence); c == nil || c.Status != StatusAffirming || !strings.Contains(c.Reason, "report v3") {
			t.Fatalf("v3 report, VCEK in %s: %+v", name, r.Claims)
		}
		if r.Binding != BindingNotApplicable || claimStatus(r, ClaimBinding) != StatusNone || claimStatus(r, ClaimMeasurement) != StatusAffirming {
			t.Fatalf("v3 report, VCEK in %s: binding %s %+v", name, r.Binding, r.Claims)
		}
	}
	r, _ := VerifyRaw(report, nil, VerifyOptions{Roots: roots})
	if c := r.Claim(ClaimEvidence); c == nil || c.Status != StatusContraindicated || !strings.Contains(c.Reason, "--cert") {
		t.Fatalf("v3 report without its VCEK: %+v", r.Claims)
	}
}
