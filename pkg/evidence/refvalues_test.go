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
		"minimum_guest_svn": {SNPReference{MinimumGuestSVN: 5}, ClaimPolicy, "GUEST_SVN 2 below the minimum 5"},
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
		// MRTD is the firmware only: unpinned RTMRs leave the kernel and
		// what runs after boot unchecked, a warning.
		{"MRTD only", TDXReference{MRTD: []HexBytes{mrtd}}, StatusWarning, "MRTD matches the reference value; RTMR0, RTMR1, RTMR2, RTMR3 not checked"},
		{"MRTD and RTMR1", TDXReference{MRTD: []HexBytes{mrtd}, RTMRs: []HexBytes{nil, rtmr[1]}}, StatusWarning, "MRTD, RTMR1 match the reference values; RTMR0, RTMR2, RTMR3 not checked"},
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

// TestAbsentReferenceValuesAreNotCheckedWarnings: a check whose reference
// value is absent is a warning naming what was not compared, never
// affirming, and never silent. Before, a report at VMPL 3 with no vmpl in the
// reference values had an affirming policy claim ("VMPL 3"), as did a TDX
// quote whose TDATTRIBUTES, XFAM and MRSEAM nothing pinned; an absent
// host_data or mr_config_id gave no claim at all; and a TDX reference pinning
// MRTD alone affirmed the measurement although RTMR0-3 (the kernel, its
// command line, what runs after boot: the gateway) were not compared.
func TestAbsentReferenceValuesAreNotCheckedWarnings(t *testing.T) {
	type want struct {
		claim  string
		status Status
		reason []string
	}
	check := func(t *testing.T, r *Result, wants []want) {
		t.Helper()
		for _, w := range wants {
			c := r.Claim(w.claim)
			if c == nil || c.Status != w.status {
				t.Errorf("%s claim %+v, want %s", w.claim, c, w.status)
				continue
			}
			for _, s := range w.reason {
				if !strings.Contains(c.Reason, s) {
					t.Errorf("%s claim %q does not say %q", w.claim, c.Reason, s)
				}
			}
		}
	}
	t.Run("sev-snp", func(t *testing.T) {
		bd := newBinding(t)
		quote, roots, _ := fakeSNPQuote(t, bd.rd, snpFake{})
		zero, svn := uint32(0), uint32(fakeGuestSVN)
		m := bytes.Repeat([]byte{0xab}, 48)
		for _, c := range []struct {
			name  string
			ref   *SNPReference
			wants []want
		}{
			{"no reference values", nil, []want{
				{ClaimPolicy, StatusWarning, []string{"VMPL 0 not checked", "GUEST_SVN 2 not checked"}},
				{ClaimHostData, StatusWarning, []string{"no host_data in the reference values: HOST_DATA 0000", "not checked"}},
			}},
			{"vmpl and minimum_guest_svn absent", &SNPReference{Measurements: []HexBytes{m}, HostData: make([]byte, 32)}, []want{
				{ClaimPolicy, StatusWarning, []string{"VMPL 0 not checked (no vmpl in the reference values)", "GUEST_SVN 2 not checked (no minimum_guest_svn"}},
				{ClaimHostData, StatusAffirming, nil},
				{ClaimMeasurement, StatusAffirming, nil},
			}},
			{"minimum_guest_svn 0 checks nothing", &SNPReference{VMPL: &zero, MinimumGuestSVN: 0}, []want{
				{ClaimPolicy, StatusWarning, []string{"GUEST_SVN 2 not checked"}},
			}},
			{"all pinned", &SNPReference{Measurements: []HexBytes{m}, HostData: make([]byte, 32), VMPL: &zero, MinimumGuestSVN: svn}, []want{
				{ClaimPolicy, StatusAffirming, []string{"VMPL 0", "GUEST_SVN 2 meets the minimum 2"}},
				{ClaimHostData, StatusAffirming, nil},
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				var rv *ReferenceValues
				if c.ref != nil {
					rv = &ReferenceValues{SEVSNP: c.ref}
				}
				r, _ := Verify(snpBundle(t, bd, quote), VerifyOptions{Roots: roots, Reference: rv})
				check(t, r, c.wants)
			})
		}
	})
	t.Run("tdx", func(t *testing.T) {
		q, err := ParseTDX(testdata.RawQuote)
		if err != nil {
			t.Fatal(err)
		}
		body := q.GetTdQuoteBody()
		rtmrs := func(n int) []HexBytes {
			var out []HexBytes
			for _, m := range body.GetRtmrs()[:n] {
				out = append(out, m)
			}
			return out
		}
		for _, c := range []struct {
			name  string
			ref   *TDXReference
			wants []want
		}{
			{"MRTD only", &TDXReference{MRTD: []HexBytes{body.GetMrTd()}}, []want{
				{ClaimPolicy, StatusWarning, []string{"TDATTRIBUTES 0000004000000000, XFAM e71a060000000000, MRSEAM 2fd279c1", "not checked (not in the reference values)"}},
				{ClaimMeasurement, StatusWarning, []string{"MRTD matches the reference value", "RTMR0, RTMR1, RTMR2, RTMR3 not checked"}},
				{ClaimHostData, StatusWarning, []string{"no mr_config_id in the reference values: MRCONFIGID", "not checked"}},
			}},
			{"MRTD and RTMR0", &TDXReference{MRTD: []HexBytes{body.GetMrTd()}, RTMRs: rtmrs(1)}, []want{
				{ClaimMeasurement, StatusWarning, []string{"MRTD, RTMR0 match the reference values", "RTMR1, RTMR2, RTMR3 not checked"}},
			}},
			{"everything pinned", &TDXReference{MRTD: []HexBytes{body.GetMrTd()}, RTMRs: rtmrs(4), MRConfigID: body.GetMrConfigId(),
				MRSeam: []HexBytes{body.GetMrSeam()}, TDAttributes: body.GetTdAttributes(), XFAM: body.GetXfam()}, []want{
				{ClaimPolicy, StatusAffirming, []string{"TDATTRIBUTES 0000004000000000", "XFAM e71a060000000000", "MRSEAM"}},
				{ClaimMeasurement, StatusAffirming, []string{"MRTD, RTMR0, RTMR1, RTMR2, RTMR3 match the reference values"}},
				{ClaimHostData, StatusAffirming, nil},
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				r, _ := VerifyRaw(testdata.RawQuote, nil, VerifyOptions{Now: sampleAt, Reference: &ReferenceValues{TDX: c.ref}})
				check(t, r, c.wants)
				if r.Verdict != StatusWarning {
					t.Errorf("verdict %s, want warning", r.Verdict)
				}
			})
		}
	})
}
