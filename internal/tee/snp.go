package tee

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/google/go-sev-guest/abi"
	sclient "github.com/google/go-sev-guest/client"
	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// SNPProvider produces SEV-SNP evidence through a go-sev-guest QuoteProvider.
type SNPProvider struct {
	QP        sclient.QuoteProvider
	Source    string           // collector name recorded in the bundle
	Now       func() time.Time // default time.Now
	Getter    trust.HTTPSGetter
	ExtraCert [][]byte // DER VCEK/VLEK to include when the host's certificate table has none
}

// NewSNP wraps a go-sev-guest QuoteProvider (the kernel's, or go-sev-guest's
// test device in tests).
func NewSNP(qp sclient.QuoteProvider, source string, now func() time.Time) *SNPProvider {
	return &SNPProvider{QP: qp, Source: source, Now: now}
}

func (*SNPProvider) Platform() string    { return evidence.PlatformSEVSNP }
func (s *SNPProvider) Collector() string { return s.Source }

// Attest asks the AMD secure processor for a report whose REPORT_DATA binds
// pub, nonce and statement, and returns it with the host's certificate table.
// When the table has no VCEK or VLEK, the certificates in ExtraCert are used;
// failing that the VCEK is fetched from AMD KDS (network) so that the bundle
// verifies offline later.
func (s *SNPProvider) Attest(ctx context.Context, pub ed25519.PublicKey, nonce []byte, statement digest.Digest) (*evidence.Bundle, error) {
	bnd, rd, err := reportDataFor(pub, nonce, statement)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	raw, err := s.QP.GetRawQuote(rd)
	if err != nil {
		return nil, fmt.Errorf("get SEV-SNP report via %s: %w", s.Source, err)
	}
	if len(raw) < abi.ReportSize {
		return nil, fmt.Errorf("SEV-SNP report via %s is %d bytes, want at least %d", s.Source, len(raw), abi.ReportSize)
	}
	// The host delivers the report and its certificate table:
	// evidence.ParseSNP checks the table's entry ranges before the vendor
	// parser, which panics on some.
	att, err := evidence.ParseSNP(raw, nil)
	if err != nil {
		return nil, fmt.Errorf("SEV-SNP report via %s: %w", s.Source, err)
	}
	rep := att.GetReport()
	if !bytes.Equal(rep.GetReportData(), rd[:]) {
		return nil, fmt.Errorf("SEV-SNP report via %s carries other report data than requested", s.Source)
	}
	out := &evidence.Raw{Type: evidence.TypeSNPReport, Data: raw}
	if chain := att.GetCertificateChain(); len(chain.GetVcekCert()) == 0 && len(chain.GetVlekCert()) == 0 {
		switch {
		case len(s.ExtraCert) > 0:
			out.Certificates = s.ExtraCert
		default:
			der, err := s.fetchVCEK(ctx, rep.GetCpuid1EaxFms(), rep.GetChipId(), rep.GetReportedTcb(), rep.GetSignerInfo())
			if err != nil {
				return nil, err
			}
			out.Certificates = [][]byte{der}
		}
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	return &evidence.Bundle{
		Format: evidence.Format, Platform: evidence.PlatformSEVSNP, Attested: true,
		Binding: bnd, Evidence: out, Collector: s.Source, CollectedAt: now().UTC(),
	}, nil
}

func (s *SNPProvider) fetchVCEK(ctx context.Context, fms uint32, chipID []byte, tcb uint64, signerInfo uint32) ([]byte, error) {
	info, err := abi.ParseSignerInfo(signerInfo)
	if err != nil {
		return nil, err
	}
	if info.SigningKey != abi.VcekReportSigner {
		return nil, fmt.Errorf("the host supplied no %v certificate and only a VCEK can be fetched from AMD KDS; provision the certificate on the host or pass it with --cert", info.SigningKey)
	}
	if fms == 0 {
		return nil, fmt.Errorf("the host supplied no VCEK and the version 2 report does not name its product; pass the VCEK with --cert")
	}
	getter := s.Getter
	if getter == nil {
		getter = trust.DefaultHTTPSGetter()
	}
	url := kds.VCEKCertURL(kds.ProductLineFromFms(fms), chipID, kds.TCBVersion(tcb))
	der, err := trust.GetWith(ctx, getter, url)
	if err != nil {
		return nil, fmt.Errorf("the host supplied no VCEK and fetching it from AMD KDS (%s) failed: %w; provision certificates on the host or pass the VCEK with --cert", url, err)
	}
	return der, nil
}
