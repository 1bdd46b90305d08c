package tee

import (
	"bytes"
	"context"
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
	ttest "github.com/google/go-tdx-guest/testing"
	"github.com/google/go-tdx-guest/testing/testdata"
	"github.com/google/uuid"

	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

const milanFMS = 0x00a00f10

// snpDevice returns go-sev-guest's fake AMD secure processor, primed to sign
// a report carrying rd, and the fake roots.
func snpDevice(t *testing.T, rd [64]byte) (*stest.QuoteProvider, *stest.AmdSigner, *evidence.Roots) {
	t.Helper()
	tcb := kds.TCBParts{BlSpl: 2, SnpSpl: 5, UcodeSpl: 60}
	tcbv, _ := kds.ComposeTCBParts(tcb)
	hwid := bytes.Repeat([]byte{0x24}, 64)
	now := time.Now()
	signer, err := (&stest.AmdSignerBuilder{
		ProductName: "Milan-B0", ArkCreationTime: now, AskCreationTime: now, AsvkCreationTime: now, VcekCreationTime: now, VlekCreationTime: now,
		HWID: [64]byte(hwid), TCB: tcbv,
		VcekCustom: stest.CertOverride{Extensions: stest.CustomExtensions(tcb, hwid, "", "Milan-B0")},
	}).TestOnlyCertChain()
	if err != nil {
		t.Fatal(err)
	}
	rep := &spb.Report{
		Version: 3, Policy: abi.SnpPolicyToBytes(abi.SnpPolicy{SMT: true}), SignatureAlgo: abi.SignEcdsaP384Sha384,
		ReportData: rd[:], Measurement: bytes.Repeat([]byte{0x5a}, 48), HostData: make([]byte, 32),
		FamilyId: make([]byte, 16), ImageId: make([]byte, 16), IdKeyDigest: make([]byte, 48), AuthorKeyDigest: make([]byte, 48),
		ReportId: make([]byte, 32), ReportIdMa: make([]byte, 32), ChipId: hwid, Signature: make([]byte, 512), Cpuid1EaxFms: milanFMS,
		ReportedTcb: uint64(tcbv), CurrentTcb: uint64(tcbv), CommittedTcb: uint64(tcbv), LaunchTcb: uint64(tcbv),
	}
	raw, err := abi.ReportToAbiBytes(rep)
	if err != nil {
		t.Fatal(err)
	}
	var out [labi.SnpReportRespReportSize]byte
	copy(out[:], raw)
	qp, err := stest.TcQuoteProvider([]stest.TestCase{{Name: "cmcp", Input: rd, Output: out}},
		&stest.DeviceOptions{Signer: signer, Now: now, Product: abi.SevProductFromCpuid1Eax(milanFMS)})
	if err != nil {
		t.Fatal(err)
	}
	var pemRoots bytes.Buffer
	for _, c := range [][]byte{signer.Ark.Raw, signer.Ask.Raw} {
		pem.Encode(&pemRoots, &pem.Block{Type: "CERTIFICATE", Bytes: c})
	}
	roots, err := evidence.ParseRoots(pemRoots.Bytes(), "fake-amd-roots.pem")
	if err != nil {
		t.Fatal(err)
	}
	return qp, signer, roots
}

// Produce with the SEV-SNP provider over go-sev-guest's test device, write
// and read the bundle, verify it.
func TestSNPProduceVerify(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	nonce := []byte("0123456789abcdef")
	stmt := digest.Bytes([]byte("genesis"))
	rd, _ := evidence.ReportData(pub, nonce, stmt)
	qp, _, roots := snpDevice(t, rd)
	p := NewSNP(qp, "test-device", nil)
	b, err := p.Attest(context.Background(), pub, nonce, stmt)
	if err != nil {
		t.Fatal(err)
	}
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	b, err = evidence.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	r, err := evidence.Verify(b, evidence.VerifyOptions{Roots: roots, ExpectNonce: nonce, ExpectKey: pub, ExpectStatement: stmt})
	if err != nil {
		t.Fatal(err)
	}
	if r.Err() != nil || r.Binding != evidence.BindingOurs || r.Claim(evidence.ClaimEvidence).Status != evidence.StatusAffirming {
		t.Fatalf("produced evidence does not verify: %+v", r.Claims)
	}
	// A different nonce than the device was primed with: the fake has no
	// answer, and the provider says which interface failed.
	if _, err := p.Attest(context.Background(), pub, []byte("other"), stmt); err == nil || !strings.Contains(err.Error(), "test-device") {
		t.Fatalf("unprimed report data: %v", err)
	}
}

// When the host's certificate table has no VCEK, the provider fetches it from
// AMD KDS (here go-sev-guest's fake KDS) so that the bundle verifies offline.
func TestSNPFetchesMissingVCEK(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	nonce := []byte("n")
	rd, _ := evidence.ReportData(pub, nonce, digest.Digest{})
	qp, signer, roots := snpDevice(t, rd)
	qp.Device.Certs = nil // the host provisioned no certificates
	kdsFake, err := stest.FakeKDSFromSigner(signer)
	if err != nil {
		t.Fatal(err)
	}
	p := NewSNP(qp, "test-device", nil)
	p.Getter = kdsFake
	b, err := p.Attest(context.Background(), pub, nonce, digest.Digest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Evidence.Certificates) != 1 {
		t.Fatalf("fetched certificates: %d", len(b.Evidence.Certificates))
	}
	r, _ := evidence.Verify(b, evidence.VerifyOptions{Roots: roots})
	if r.Err() != nil {
		t.Fatalf("bundle with fetched VCEK: %v", r.Err())
	}
	// With a VCEK supplied by the operator nothing is fetched.
	p2 := NewSNP(qp, "test-device", nil)
	p2.ExtraCert = [][]byte{signer.Vcek.Raw}
	p2.Getter = failingGetter{}
	if b, err = p2.Attest(context.Background(), pub, nonce, digest.Digest{}); err != nil {
		t.Fatal(err)
	}
	if r, _ := evidence.Verify(b, evidence.VerifyOptions{Roots: roots}); r.Err() != nil {
		t.Fatalf("bundle with supplied VCEK: %v", r.Err())
	}
	// Neither: a clear error.
	p3 := NewSNP(qp, "test-device", nil)
	p3.Getter = failingGetter{}
	if _, err := p3.Attest(context.Background(), pub, nonce, digest.Digest{}); err == nil || !strings.Contains(err.Error(), "--cert") {
		t.Fatalf("no VCEK anywhere: %v", err)
	}
}

type failingGetter struct{}

func (failingGetter) Get(url string) ([]byte, error) { return nil, errNoNetwork }

var errNoNetwork = &netErr{}

type netErr struct{}

func (*netErr) Error() string { return "no network in this test" }

// The TDX provider goes through go-tdx-guest's client; its test provider
// replays the genuine sample quote, whose report data is not ours: the
// provider refuses to return evidence that does not bind what was asked.
func TestTDXProviderChecksReportData(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	rd, _ := evidence.ReportData(pub, []byte("n"), digest.Digest{})
	qp, err := ttest.TcQuoteProvider([]ttest.TestCase{{Name: "sample", Input: rd, Quote: testdata.RawQuote}})
	if err != nil {
		t.Fatal(err)
	}
	p := NewTDX(qp, "test-provider", nil)
	_, err = p.Attest(context.Background(), pub, []byte("n"), digest.Digest{})
	if err == nil || !strings.Contains(err.Error(), "other report data") {
		t.Fatalf("TDX quote with foreign report data: %v", err)
	}
}

// badTableQP is go-sev-guest's test device with a host certificate table
// appended to the report it returns.
type badTableQP struct {
	*stest.QuoteProvider
	table []byte
}

func (q badTableQP) GetRawQuote(rd [64]byte) ([]byte, error) {
	raw, err := q.QuoteProvider.GetRawQuote(rd)
	return append(raw[:abi.ReportSize:abi.ReportSize], q.table...), err
}

// TestProvidersRefuseMalformedEvidenceWithoutPanicking: the host delivers the
// report or quote; lengths in it that run past its end (a certificate table
// entry whose offset plus length overflows 32 bits, a TDX QE authentication
// data length of 0xffff) made the vendor parsers slice out of range, a panic
// in the gateway's start and in `cmcp attest`. They are errors naming the
// malformed evidence.
func TestProvidersRefuseMalformedEvidenceWithoutPanicking(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	rd, _ := evidence.ReportData(pub, []byte("n"), digest.Digest{})
	attest := func(t *testing.T, p interface {
		Attest(context.Context, ed25519.PublicKey, []byte, digest.Digest) (*evidence.Bundle, error)
	}) (err error) {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Attest panicked: %v", r)
			}
		}()
		_, err = p.Attest(context.Background(), pub, []byte("n"), digest.Digest{})
		return err
	}
	t.Run("sev-snp certificate table", func(t *testing.T) {
		qp, _, _ := snpDevice(t, rd)
		// One entry: the VCEK GUID, offset 48, length 0xffffffff; then the
		// all-zero terminator and 100 bytes.
		entry := append(append([]byte{}, uuidBytes(abi.VcekGUID)...), 48, 0, 0, 0, 0xff, 0xff, 0xff, 0xff)
		table := append(entry, make([]byte, 24+100)...)
		p := NewSNP(badTableQP{qp, table}, "test-device", nil)
		p.ExtraCert = [][]byte{{1}}
		err := attest(t, p)
		if err == nil || !strings.Contains(err.Error(), "certificate table") || !strings.Contains(err.Error(), "claims bytes") {
			t.Fatalf("SEV-SNP report with an overflowing certificate table: %v", err)
		}
	})
	t.Run("tdx quote", func(t *testing.T) {
		q, err := os.ReadFile("../../testdata/evidence/tdx-spr-e4-quote.dat")
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint16(q[1218:], 0xffff)
		qp, err := ttest.TcQuoteProvider([]ttest.TestCase{{Name: "malformed", Input: rd, Quote: q}})
		if err != nil {
			t.Fatal(err)
		}
		err = attest(t, NewTDX(qp, "test-provider", nil))
		if err == nil || !strings.Contains(err.Error(), "the TDX quote is malformed") {
			t.Fatalf("malformed TDX quote: %v", err)
		}
	})
}

func uuidBytes(s string) []byte {
	u := uuid.MustParse(s)
	return u[:]
}
