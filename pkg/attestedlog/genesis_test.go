package attestedlog

import (
	"os"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// TestRequireAttestedWarnsWhenRTMRsAreNotPinned: a TDX reference that pins
// MRTD alone leaves RTMR0-3 (kernel, command line, what runs after boot: the
// gateway) unchecked. Before, the measurement claim was affirming and
// --require-attested said nothing; now the epoch's note and the one warning
// say the measurement was not fully checked, and why.
func TestRequireAttestedWarnsWhenRTMRsAreNotPinned(t *testing.T) {
	quote, err := os.ReadFile("../../testdata/evidence/tdx-spr-e4-quote.dat")
	if err != nil {
		t.Fatal(err)
	}
	mrtd := make([]byte, 48)
	copy(mrtd, quote[48+136:48+184])
	ref := &evidence.ReferenceValues{TDX: &evidence.TDXReference{MRTD: []evidence.HexBytes{mrtd}}}
	res, err := evidence.VerifyRaw(quote, nil, evidence.VerifyOptions{Reference: ref, Now: time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		t.Fatal(err)
	}
	c := &GenesisCheck{RequireAttested: true, Options: evidence.VerifyOptions{Reference: ref}}
	c.Results = []*GenesisResult{{Epoch: 1, Platform: evidence.PlatformTDX, Attested: true, Verdict: string(res.Verdict), Claims: res.Claims}}
	const warning = "--require-attested: the key of epoch 1 is bound to genuine hardware evidence, but the launch measurement was NOT fully checked against reference values, so any code in a genuine VM could hold the key (the --reference values do not pin MRTD and all four RTMRs)"
	if got := c.UnmeasuredWarning(); got != warning {
		t.Fatalf("warning %q, want %q", got, warning)
	}
	const note = "launch measurement (MRTD and RTMRs) NOT fully checked against reference values, so any code in a genuine tdx VM could hold this key: the --reference values do not pin MRTD and all four RTMRs"
	if got := c.unmeasuredNote(evidence.PlatformTDX); got != note {
		t.Fatalf("note %q, want %q", got, note)
	}
}
