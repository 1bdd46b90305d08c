package tee

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"time"

	tclient "github.com/google/go-tdx-guest/client"

	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// TDXProvider produces Intel TDX quotes through go-tdx-guest.
type TDXProvider struct {
	// QP is a go-tdx-guest client.QuoteProvider or client.Device; nil opens
	// the guest device for each quote.
	QP     any
	Source string
	Now    func() time.Time
}

// NewTDX wraps a go-tdx-guest quote provider or device.
func NewTDX(qp any, source string, now func() time.Time) *TDXProvider {
	return &TDXProvider{QP: qp, Source: source, Now: now}
}

func (*TDXProvider) Platform() string    { return evidence.PlatformTDX }
func (t *TDXProvider) Collector() string { return t.Source }

// Attest returns a TDX quote (version 4, with its PCK chain) whose REPORTDATA
// binds pub, nonce and statement.
func (t *TDXProvider) Attest(ctx context.Context, pub ed25519.PublicKey, nonce []byte, statement digest.Digest) (*evidence.Bundle, error) {
	bnd, rd, err := reportDataFor(pub, nonce, statement)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	qp := t.QP
	if qp == nil {
		d, err := tclient.OpenDevice()
		if err != nil {
			return nil, fmt.Errorf("open TDX guest device: %w", err)
		}
		defer d.Close()
		qp = d
	}
	raw, err := tclient.GetRawQuote(qp, rd)
	if err != nil {
		return nil, fmt.Errorf("get TDX quote via %s: %w", t.Source, err)
	}
	// The host delivers the quote: evidence.ParseTDX checks its lengths
	// before the vendor parser, which panics on some.
	q4, err := evidence.ParseTDX(raw)
	if err != nil {
		return nil, fmt.Errorf("TDX quote via %s: %w", t.Source, err)
	}
	if !bytes.Equal(q4.GetTdQuoteBody().GetReportData(), rd[:]) {
		return nil, fmt.Errorf("TDX quote via %s carries other report data than requested", t.Source)
	}
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	return &evidence.Bundle{
		Format: evidence.Format, Platform: evidence.PlatformTDX, Attested: true,
		Binding: bnd, Evidence: &evidence.Raw{Type: evidence.TypeTDXQuote, Data: raw},
		Collector: t.Source, CollectedAt: now().UTC(),
	}, nil
}
