package evidence

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-tdx-guest/testing/testdata"
)

// Every reference value that can be written is enforced.
func TestEveryReferenceValueIsEnforced(t *testing.T) {
	bd := newBinding(t)
	snp, snpRoots, _ := fakeSNPQuote(t, bd.rd, snpFake{})
	f, no := false, uint32(1)
	snpCases := map[string]struct {
		ref    SNPReference
		claim  string
		reason string
	}{
		"vmpl":              {SNPReference{VMPL: &no}, ClaimPolicy, "VMPL 0, expected 1"},
		"minimum_guest_svn": {SNPReference{MinimumGuestSVN: 5}, ClaimPolicy, "GUEST_SVN 0 below the minimum 5"},
		"allow_smt false":   {SNPReference{AllowSMT: &f}, ClaimPolicy, "SMT is allowed"},
		"host_data":         {SNPReference{HostData: bytes.Repeat([]byte{2}, 32)}, ClaimHostData, "HOST_DATA"},
		"measurements":      {SNPReference{Measurements: []HexBytes{make([]byte, 48)}}, ClaimMeasurement, "not among"},
		"minimum_tcb":       {SNPReference{MinimumTCB: &SNPTCB{Microcode: 200}}, ClaimTCB, "microcode 115 < 200"},
	}
	for name, c := range snpCases {
		ref := c.ref
		r, _ := Verify(snpBundle(t, bd, snp), VerifyOptions{Roots: snpRoots, Reference: &ReferenceValues{SEVSNP: &ref}})
		if cl := r.Claim(c.claim); cl == nil || cl.Status != StatusContraindicated || !strings.Contains(cl.Reason, c.reason) {
			t.Errorf("sev-snp %s: %+v", name, r.Claims)
		}
	}
	other := bytes.Repeat([]byte{0x33}, 48)
	tdxCases := map[string]struct {
		ref    TDXReference
		claim  string
		reason string
	}{
		"td_attributes":       {TDXReference{TDAttributes: make([]byte, 8)}, ClaimPolicy, "TDATTRIBUTES 0000004000000000, expected 0000000000000000"},
		"xfam":                {TDXReference{XFAM: make([]byte, 8)}, ClaimPolicy, "XFAM e71a060000000000, expected"},
		"mr_seam":             {TDXReference{MRSeam: []HexBytes{other}}, ClaimPolicy, "MRSEAM"},
		"mr_config_id":        {TDXReference{MRConfigID: other}, ClaimHostData, "MRCONFIGID"},
		"mr_td":               {TDXReference{MRTD: []HexBytes{other}}, ClaimMeasurement, "MRTD"},
		"rtmrs":               {TDXReference{RTMRs: []HexBytes{nil, nil, nil, other}}, ClaimMeasurement, "RTMR3"},
		"minimum_tee_tcb_svn": {TDXReference{MinimumTEETCBSVN: bytes.Repeat([]byte{9}, 16)}, ClaimTCB, "below the minimum"},
	}
	for name, c := range tdxCases {
		ref := c.ref
		r, _ := VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt, Reference: &ReferenceValues{TDX: &ref}})
		if cl := r.Claim(c.claim); cl == nil || cl.Status != StatusContraindicated || !strings.Contains(cl.Reason, c.reason) {
			t.Errorf("tdx %s: %+v", name, r.Claims)
		}
	}
	// Malformed reference files are refused with the field named.
	for _, bad := range []string{
		`{"sev-snp": {"measurements": ["00"]}}`,
		`{"tdx": {"rtmrs": ["", "", "", "", ""]}}`,
		`{"tdx": {"xfam": "00"}}`,
		`{"tdx": {"debug": true}}`,
		`{}`,
	} {
		if _, err := ParseReferenceValues([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// TestReferenceValuesEmptyOrDuplicate: a member given but empty, or given
// twice, is refused. Before, "measurements": [] or "host_data": "" left the
// check undone (a warning, exit 0) and a duplicate silently kept the last.
func TestReferenceValuesEmptyOrDuplicate(t *testing.T) {
	m := strings.Repeat("ab", 48)
	for bad, want := range map[string]string{
		`{"sev-snp": {"measurements": []}}`:                                    "sev-snp.measurements is empty",
		`{"sev-snp": {"host_data": ""}}`:                                       "sev-snp.host_data is empty",
		`{"tdx": {"mr_td": []}}`:                                               "tdx.mr_td is empty",
		`{"tdx": {"mr_config_id": ""}}`:                                        "tdx.mr_config_id is empty",
		`{"tdx": {"rtmrs": []}}`:                                               "tdx.rtmrs is empty",
		`{"tdx": {"minimum_tee_tcb_svn": ""}}`:                                 "tdx.minimum_tee_tcb_svn is empty",
		`{"sev-snp": {"measurements": ["` + m + `"], "measurements": []}}`:     "duplicate",
		`{"sev-snp": {"measurements": ["` + m + `"]}, "sev-snp": {"vmpl": 0}}`: "duplicate",
	} {
		if _, err := ParseReferenceValues([]byte(bad)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", bad, err, want)
		}
	}
	// "" in rtmrs still means "this RTMR is not checked".
	if _, err := ParseReferenceValues([]byte(`{"tdx": {"rtmrs": ["", "` + m + `"]}}`)); err != nil {
		t.Fatal(err)
	}
}

// TestReferenceValuesForAnotherPlatform: reference values with no section
// for the evidence's platform reject it (exit 21 in the CLI). Before, a TDX
// quote checked against SEV-SNP-only reference values, or software evidence
// allowed for development, verified with a warning: the auditor's values
// were parsed but never applied.
func TestReferenceValuesForAnotherPlatform(t *testing.T) {
	snpOnly, err := ParseReferenceValues([]byte(`{"sev-snp":{"measurements":["` + strings.Repeat("ab", 48) + `"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	tdxOnly, err := ParseReferenceValues([]byte(`{"tdx":{"minimum_tee_tcb_svn":"` + strings.Repeat("00", 16) + `"}}`))
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, r *Result, want string) {
		t.Helper()
		c := r.Claim(ClaimMeasurement)
		if r.Verdict != StatusContraindicated || r.Failure() != FailRefValue || c == nil || c.Status != StatusContraindicated || !strings.Contains(c.Reason, want) {
			t.Errorf("%s: verdict %s failure %q claims %+v, want a contraindicated measurement claim with %q", name, r.Verdict, r.Failure(), r.Claims, want)
		}
	}

	// The genuine TDX sample quote, raw and as a bundle, against SEV-SNP values.
	r, err := VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt, Reference: snpOnly})
	if err != nil {
		t.Fatal(err)
	}
	check("raw TDX quote, sev-snp reference", r, `no "tdx" section (they cover sev-snp only)`)
	// The same quote with matching-platform values is not affected.
	r, _ = VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt, Reference: tdxOnly})
	if r.Verdict == StatusContraindicated {
		t.Fatalf("raw TDX quote, tdx reference: %+v", r.Claims)
	}

	// Software evidence allowed for development still cannot satisfy reference values.
	b := softwareBundle(t)
	r, _ = Verify(b, VerifyOptions{AllowSoftware: true, Reference: snpOnly})
	check("software bundle, sev-snp reference", r, `no "software" section`)
	r, _ = Verify(b, VerifyOptions{AllowSoftware: true})
	if r.Verdict != StatusWarning {
		t.Fatalf("software bundle without reference values: %s %+v", r.Verdict, r.Claims)
	}
}

// TestTDXReferenceOfOnlyEmptyRTMRsIsRefused: "rtmrs" whose entries are all
// "" checks nothing and is refused like any other empty member. Before, it
// was accepted and turned the measurement claim affirming ("match the
// reference values") with nothing compared.
func TestTDXReferenceOfOnlyEmptyRTMRsIsRefused(t *testing.T) {
	for _, js := range []string{`{"tdx":{"rtmrs":[""]}}`, `{"tdx":{"rtmrs":["","","",""]}}`} {
		if _, err := ParseReferenceValues([]byte(js)); err == nil || !strings.Contains(err.Error(), `tdx.rtmrs has only "" entries, which check nothing`) {
			t.Errorf("%s: %v, want refused", js, err)
		}
	}
	// Built in Go (not parsed), the same values still affirm nothing.
	for _, rtmrs := range [][]HexBytes{{nil}, {{}, {}, {}, {}}} {
		r, _ := VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt, Reference: &ReferenceValues{TDX: &TDXReference{RTMRs: rtmrs}}})
		if c := r.Claim(ClaimMeasurement); c == nil || c.Status != StatusWarning || !strings.Contains(c.Reason, "not checked") {
			t.Errorf("rtmrs %q: measurement %+v, want a warning", rtmrs, c)
		}
	}
}

// TestTDXMeasurementClaimNamesWhatWasCompared: the measurement claim affirms
// only what was compared and names the rest as not checked; RTMRs that
// match while MRTD is not pinned are a warning, since the firmware in MRTD
// extends the RTMRs.
func TestTDXMeasurementClaimNamesWhatWasCompared(t *testing.T) {
	q, err := ParseTDX(testdata.RawQuote)
	if err != nil {
		t.Fatal(err)
	}
	mrtd, rtmr := q.GetTdQuoteBody().GetMrTd(), q.GetTdQuoteBody().GetRtmrs()
	for _, c := range []struct {
		name   string
		ref    TDXReference
		status Status
		reason string
	}{
		{"MRTD only", TDXReference{MRTD: []HexBytes{mrtd}}, StatusAffirming, "MRTD matches the reference value; RTMR0, RTMR1, RTMR2, RTMR3 not checked"},
		{"MRTD and RTMR1", TDXReference{MRTD: []HexBytes{mrtd}, RTMRs: []HexBytes{nil, rtmr[1]}}, StatusAffirming, "MRTD, RTMR1 match the reference values; RTMR0, RTMR2, RTMR3 not checked"},
		{"all", TDXReference{MRTD: []HexBytes{mrtd}, RTMRs: []HexBytes{rtmr[0], rtmr[1], rtmr[2], rtmr[3]}}, StatusAffirming, "MRTD, RTMR0, RTMR1, RTMR2, RTMR3 match the reference values"},
		{"RTMR1 without MRTD", TDXReference{RTMRs: []HexBytes{nil, rtmr[1]}}, StatusWarning, "RTMR1 matches the reference value, but MRTD 6363b804"},
		{"no measurement", TDXReference{XFAM: q.GetTdQuoteBody().GetXfam()}, StatusWarning, "no reference MRTD or RTMRs"},
	} {
		ref := c.ref
		r, _ := VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt, Reference: &ReferenceValues{TDX: &ref}})
		cl := r.Claim(ClaimMeasurement)
		if cl == nil || cl.Status != c.status || !strings.HasPrefix(cl.Reason, c.reason) {
			t.Errorf("%s: %+v, want %s %q", c.name, cl, c.status, c.reason)
		}
		if c.name == "all" && strings.Contains(cl.Reason, "not checked") {
			t.Errorf("all: %q", cl.Reason)
		}
	}
}
