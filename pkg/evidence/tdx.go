package evidence

import (
	"encoding/hex"
	"fmt"
	"strings"

	tabi "github.com/google/go-tdx-guest/abi"
	tpb "github.com/google/go-tdx-guest/proto/tdx"
	tvalidate "github.com/google/go-tdx-guest/validate"
	tverify "github.com/google/go-tdx-guest/verify"
)

// ParseTDX parses a raw TDX quote; only version 4 is accepted.
func ParseTDX(raw []byte) (*tpb.QuoteV4, error) {
	q, err := tabi.QuoteToProto(raw)
	if err != nil {
		return nil, fmt.Errorf("TDX quote: %v", err)
	}
	q4, ok := q.(*tpb.QuoteV4)
	if !ok {
		return nil, fmt.Errorf("TDX quote is %T, want version 4", q)
	}
	return q4, nil
}

// tdAttrDebug is bit 0 of TDATTRIBUTES: the TD is debuggable.
const tdAttrDebug = 1

// verifyTDX appraises a TDX quote v4 and returns its REPORTDATA if the
// signature chain verified, else nil.
func verifyTDX(r *Result, raw []byte, o *VerifyOptions) []byte {
	q, err := ParseTDX(raw)
	if err != nil {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "%v", err)
		return nil
	}
	body := q.GetTdQuoteBody()
	r.field("version", fmt.Sprint(q.GetHeader().GetVersion()))
	r.field("mr_td", hex.EncodeToString(body.GetMrTd()))
	for i, m := range body.GetRtmrs() {
		r.field(fmt.Sprintf("rtmr%d", i), hex.EncodeToString(m))
	}
	r.field("mr_seam", hex.EncodeToString(body.GetMrSeam()))
	r.field("mr_config_id", hex.EncodeToString(body.GetMrConfigId()))
	r.field("td_attributes", hex.EncodeToString(body.GetTdAttributes()))
	r.field("xfam", hex.EncodeToString(body.GetXfam()))
	r.field("tee_tcb_svn", hex.EncodeToString(body.GetTeeTcbSvn()))
	r.field("report_data", hex.EncodeToString(body.GetReportData()))
	if o.Roots.nIntel == 0 {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "no Intel root CA in %s", o.Roots.Source)
		return nil
	}
	// TrustedRoots is always set: with nil, go-tdx-guest falls back to its
	// embedded root and logs a warning to stdout.
	if err := tverify.TdxQuote(q, &tverify.Options{TrustedRoots: o.Roots.intel, Now: o.Now}); err != nil {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "TDX quote signature or PCK chain does not verify against %s roots: %v", o.Roots.Source, err)
		return nil
	}
	r.add(ClaimEvidence, StatusAffirming, "", "TDX quote v4 signed by the QE attestation key, QE report signed by the PCK, PCK chain to the Intel SGX Root CA")
	rootsClaim(r, o)

	attrs := body.GetTdAttributes()
	if len(attrs) != 8 || attrs[0]&tdAttrDebug != 0 {
		r.add(ClaimDebug, StatusContraindicated, FailRefValue, "TDATTRIBUTES %s has DEBUG set: the host can read and change TD memory", hex.EncodeToString(attrs))
	} else {
		r.add(ClaimDebug, StatusAffirming, "", "TDATTRIBUTES.DEBUG is off")
	}
	var ref *TDXReference
	if o.Reference != nil {
		ref = o.Reference.TDX
	}
	tdxPolicyClaim(r, q, ref)
	tdxMeasurementClaims(r, body, ref)
	tdxTCBClaim(r, body, ref)
	return body.GetReportData()
}

func tdxPolicyClaim(r *Result, q *tpb.QuoteV4, ref *TDXReference) {
	body := q.GetTdQuoteBody()
	var bad []string
	// The library's fixed-bit checks of TDATTRIBUTES and XFAM.
	if err := tvalidate.TdxQuote(q, &tvalidate.Options{}); err != nil {
		bad = append(bad, err.Error())
	}
	if ref != nil {
		if len(ref.TDAttributes) > 0 && !anyEqual(body.GetTdAttributes(), []HexBytes{ref.TDAttributes}) {
			bad = append(bad, fmt.Sprintf("TDATTRIBUTES %s, expected %s", hex.EncodeToString(body.GetTdAttributes()), hex.EncodeToString(ref.TDAttributes)))
		}
		if len(ref.XFAM) > 0 && !anyEqual(body.GetXfam(), []HexBytes{ref.XFAM}) {
			bad = append(bad, fmt.Sprintf("XFAM %s, expected %s", hex.EncodeToString(body.GetXfam()), hex.EncodeToString(ref.XFAM)))
		}
		if len(ref.MRSeam) > 0 && !anyEqual(body.GetMrSeam(), ref.MRSeam) {
			bad = append(bad, fmt.Sprintf("MRSEAM %s is not a reference value", hex.EncodeToString(body.GetMrSeam())))
		}
	}
	if len(bad) > 0 {
		r.add(ClaimPolicy, StatusContraindicated, FailRefValue, "%s", join(bad))
		return
	}
	r.add(ClaimPolicy, StatusAffirming, "", "TDATTRIBUTES %s and XFAM %s are acceptable", hex.EncodeToString(body.GetTdAttributes()), hex.EncodeToString(body.GetXfam()))
}

func tdxMeasurementClaims(r *Result, body *tpb.TDQuoteBody, ref *TDXReference) {
	if ref == nil || (len(ref.MRTD) == 0 && len(ref.RTMRs) == 0) {
		r.add(ClaimMeasurement, StatusWarning, "", "no reference MRTD or RTMRs: MRTD %s not checked", hex.EncodeToString(body.GetMrTd()))
	} else {
		var bad, good []string
		if len(ref.MRTD) > 0 {
			if anyEqual(body.GetMrTd(), ref.MRTD) {
				good = append(good, "MRTD")
			} else {
				bad = append(bad, fmt.Sprintf("MRTD %s is not among the %d reference values", hex.EncodeToString(body.GetMrTd()), len(ref.MRTD)))
			}
		}
		rtmrs := body.GetRtmrs()
		for i, want := range ref.RTMRs {
			if len(want) == 0 {
				continue
			}
			if i < len(rtmrs) && anyEqual(rtmrs[i], []HexBytes{want}) {
				good = append(good, fmt.Sprintf("RTMR%d", i))
			} else {
				got := ""
				if i < len(rtmrs) {
					got = hex.EncodeToString(rtmrs[i])
				}
				bad = append(bad, fmt.Sprintf("RTMR%d %s, expected %s", i, got, hex.EncodeToString(want)))
			}
		}
		if len(bad) > 0 {
			r.add(ClaimMeasurement, StatusContraindicated, FailRefValue, "%s", join(bad))
		} else {
			r.add(ClaimMeasurement, StatusAffirming, "", "%s match the reference values", strings.Join(good, ", "))
		}
	}
	if ref != nil && len(ref.MRConfigID) > 0 {
		if anyEqual(body.GetMrConfigId(), []HexBytes{ref.MRConfigID}) {
			r.add(ClaimHostData, StatusAffirming, "", "MRCONFIGID matches the reference value")
		} else {
			r.add(ClaimHostData, StatusContraindicated, FailRefValue, "MRCONFIGID %s, expected %s", hex.EncodeToString(body.GetMrConfigId()), hex.EncodeToString(ref.MRConfigID))
		}
	}
}

func tdxTCBClaim(r *Result, body *tpb.TDQuoteBody, ref *TDXReference) {
	const offline = "TCB status (UpToDate, OutOfDate, ...) needs Intel PCS collateral and is not established offline"
	svn := body.GetTeeTcbSvn()
	if ref != nil && len(ref.MinimumTEETCBSVN) > 0 {
		for i := range ref.MinimumTEETCBSVN {
			if i >= len(svn) || svn[i] < ref.MinimumTEETCBSVN[i] {
				r.add(ClaimTCB, StatusContraindicated, FailRefValue, "TEE_TCB_SVN %s is below the minimum %s (component %d)", hex.EncodeToString(svn), hex.EncodeToString(ref.MinimumTEETCBSVN), i)
				return
			}
		}
		r.add(ClaimTCB, StatusWarning, "", "TEE_TCB_SVN %s meets the minimum; %s", hex.EncodeToString(svn), offline)
		return
	}
	r.add(ClaimTCB, StatusWarning, "", "no minimum TEE_TCB_SVN in the reference values (reported %s); %s", hex.EncodeToString(svn), offline)
}
