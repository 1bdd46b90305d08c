package evidence

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"strings"

	tabi "github.com/google/go-tdx-guest/abi"
	"github.com/google/go-tdx-guest/pcs"
	tpb "github.com/google/go-tdx-guest/proto/tdx"
)

// ParseTDX parses a raw TDX quote; only version 4 is accepted. A quote whose
// length fields run past its end, or that makes the vendor parser panic, is
// an error saying the quote is malformed.
func ParseTDX(raw []byte) (*tpb.QuoteV4, error) {
	if len(raw) >= tabi.QuoteMinSize && binary.LittleEndian.Uint16(raw) == tabi.QuoteVersion {
		if err := checkTDXQuoteLengths(raw); err != nil {
			return nil, malformed("TDX quote", err)
		}
	}
	var q any
	if err := recoverParse("TDX quote", func() (err error) {
		q, err = tabi.QuoteToProto(raw)
		return err
	}); err != nil {
		if _, ok := err.(*malformedError); ok {
			return nil, err
		}
		return nil, fmt.Errorf("TDX quote: %v", err)
	}
	q4, ok := q.(*tpb.QuoteV4)
	if !ok {
		return nil, fmt.Errorf("TDX quote is %T, want version 4", q)
	}
	return q4, nil
}

// checkTDXQuoteLengths checks, in 64-bit arithmetic, each length field of a
// TDX quote v4's signed data against the bytes that follow it. go-tdx-guest
// (v0.3.1) slices by these lengths without checking them: a QE
// authentication data length past the end, or signed data too short for its
// fixed fields, panics there.
func checkTDXQuoteLengths(raw []byte) error {
	const (
		signedSizeAt = 0x278        // after the header (0x30) and the TD quote body (0x248)
		signedAt     = 0x27C        // the signed data follows its 4-byte size
		sigAndKey    = 64 + 64      // quote signature, attestation key
		certHeader   = 2 + 4        // certification data type and size
		qeFixed      = 384 + 64 + 2 // QE report, its signature, QE authentication data size
		pckHeader    = 2 + 4        // PCK certificate chain type and size
	)
	n := uint64(len(raw))
	if n < signedAt {
		return fmt.Errorf("%d bytes, fewer than the header, TD quote body and signed data size (%d)", n, signedAt)
	}
	size := uint64(binary.LittleEndian.Uint32(raw[signedSizeAt:]))
	if signedAt+size > n {
		return fmt.Errorf("signed data size %d runs past the end of the quote (%d bytes follow the size)", size, n-signedAt)
	}
	if size < sigAndKey+certHeader {
		return fmt.Errorf("signed data of %d bytes is shorter than its signature, attestation key and certification data header (%d bytes)", size, sigAndKey+certHeader)
	}
	cd := raw[signedAt+sigAndKey : signedAt+size]
	if cdSize := uint64(binary.LittleEndian.Uint32(cd[2:])); cdSize != uint64(len(cd))-certHeader {
		return fmt.Errorf("certification data size %d is not the %d bytes that follow it in the signed data", cdSize, len(cd)-certHeader)
	}
	qerc := cd[certHeader:]
	if uint64(len(qerc)) < qeFixed {
		return fmt.Errorf("certification data of %d bytes is shorter than a QE report, its signature and the QE authentication data size (%d bytes)", len(qerc), qeFixed)
	}
	auth := uint64(binary.LittleEndian.Uint16(qerc[qeFixed-2:]))
	if qeFixed+auth+pckHeader > uint64(len(qerc)) {
		return fmt.Errorf("QE authentication data length %d runs past the certification data (%d bytes follow the length, and the PCK certificate chain header needs %d of them)", auth, uint64(len(qerc))-qeFixed, pckHeader)
	}
	pck := qerc[qeFixed+auth:]
	if pckSize := uint64(binary.LittleEndian.Uint32(pck[2:])); pckSize != uint64(len(pck))-pckHeader {
		return fmt.Errorf("PCK certificate chain size %d is not the %d bytes that follow it in the certification data", pckSize, len(pck)-pckHeader)
	}
	return nil
}

// tdAttrDebug is bit 0 of TDATTRIBUTES: the TD is debuggable.
const tdAttrDebug = 1

// Fixed bits (Intel TDX module ABI, as in go-tdx-guest v0.3.1's validate).
const (
	xfamFixed1         = 0x00000003
	xfamFixed0         = 0x0006DBE7
	tdAttributesFixed0 = 0x1 | 1<<28 | 1<<30 | 1<<63 // DEBUG, SEPT_VE_DISABLE, PKS, PERFMON
)

// Intel's TD quoting enclave. The PCK signs the report of any enclave on the
// platform that asks the PCE for one, so a QE report that verifies does not
// by itself say that the enclave is Intel's TD QE: another enclave, or a
// debug build of the QE whose memory the host can read, could certify an
// attestation key of its choosing and sign any TD body with it. Online
// verifiers learn the QE's identity from Intel PCS collateral (the TD_QE
// enclave identity); offline, cmcp pins it. The values are those of Intel's
// TD_QE identity as recorded in go-tdx-guest v0.3.1
// (testing/testdata/sample_qeIdentity_response: mrsigner, isvprodid 2, an
// attributes mask that covers DEBUG with DEBUG expected clear) and of the
// genuine sample quote there; the QE vendor ID is Intel's (go-tdx-guest's
// validate and tools/check tests). TestIntelTDQEIdentityPins holds them to
// both.
var (
	intelQEVendorID   = mustHex("939a7233f79c4ca9940a0db3957f0607")
	intelTDQEMRSigner = mustHex("dc9e2a7c6f948f17474e34a7fc43ed030f7c1563f1babddf6340c82e0e54a8c5")
)

const (
	intelTDQEProdID = 2
	// sgxAttrDebug is bit 1 of an SGX enclave's ATTRIBUTES: a debug enclave.
	sgxAttrDebug = 0x02
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// checkTDQE refuses a quote that Intel's TD quoting enclave did not produce:
// the header's QE vendor ID, and the QE report's MRSIGNER, ISVPRODID and
// DEBUG attribute. The QE's ISVSVN is not checked: which SVNs are current is
// Intel's TCB status, which needs collateral (the TCB claim says so).
func checkTDQE(q *tpb.QuoteV4) error {
	if v := q.GetHeader().GetQeVendorId(); !bytes.Equal(v, intelQEVendorID) {
		return fmt.Errorf("TDX quote header names QE vendor %s, not Intel (%s): only quotes of Intel's TD quoting enclave are accepted", hex.EncodeToString(v), hex.EncodeToString(intelQEVendorID))
	}
	qe := q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetQeReport()
	var bad []string
	if !bytes.Equal(qe.GetMrSigner(), intelTDQEMRSigner) {
		bad = append(bad, fmt.Sprintf("MRSIGNER %s is not Intel's %s", hex.EncodeToString(qe.GetMrSigner()), hex.EncodeToString(intelTDQEMRSigner)))
	}
	if qe.GetIsvProdId() != intelTDQEProdID {
		bad = append(bad, fmt.Sprintf("ISVPRODID %d is not the TD QE's %d", qe.GetIsvProdId(), intelTDQEProdID))
	}
	if a := qe.GetAttributes(); len(a) == 0 || a[0]&sgxAttrDebug != 0 {
		bad = append(bad, fmt.Sprintf("ATTRIBUTES %s mark a debug enclave, whose memory (and attestation key) the host can read", hex.EncodeToString(a)))
	}
	if len(bad) > 0 {
		return fmt.Errorf("TDX quote was not produced by Intel's TD quoting enclave, although its PCK certified the enclave: QE report %s", join(bad))
	}
	return nil
}

// verifyTDXChain checks a quote the way go-tdx-guest's verify does without
// collateral: the quote's structure; its PCK chain (leaf, intermediate, root
// as PEM, all X.509 v3 ECDSA P-256 with SHA-256, Intel's subject names, each
// signed by the next); the PCK leaf chained through the quote's intermediate
// to a root of o.Roots (never the quote's own root) and valid at o.Now; the
// QE report signed by the PCK key; the QE report data committing to the
// attestation key; and the quote signature over header and body by that key.
// Beyond the library's offline checks, the QE must be Intel's TD QE
// (checkTDQE). It returns the root of o.Roots the PCK chained to.
func verifyTDXChain(q *tpb.QuoteV4, o *VerifyOptions) (*x509.Certificate, error) {
	if len(o.Roots.intelCerts) == 0 {
		return nil, fmt.Errorf("no Intel root CA in %s", o.Roots.Source)
	}
	if err := tabi.CheckQuoteV4(q); err != nil {
		return nil, fmt.Errorf("TDX quote: %v", err)
	}
	if q.GetHeader().GetTeeType() != 0x81 {
		return nil, fmt.Errorf("TDX quote: TEE type 0x%x is not TDX (0x81)", q.GetHeader().GetTeeType())
	}
	qerc := q.GetSignedData().GetCertificationData().GetQeReportCertificationData()
	chain, err := pckChain(qerc.GetPckCertificateChainData().GetPckCertChain())
	if err != nil {
		return nil, err
	}
	leaf, inter, root := chain[0], chain[1], chain[2]
	for _, c := range []struct {
		cert, parent *x509.Certificate
		names        []string
	}{
		{root, root, []string{"Intel SGX Root CA"}},
		{inter, root, []string{"Intel SGX PCK Platform CA", "Intel SGX PCK Processor CA"}},
		{leaf, inter, []string{"Intel SGX PCK Certificate"}},
	} {
		if err := checkIntelCert(c.cert, c.parent, c.names); err != nil {
			return nil, fmt.Errorf("TDX PCK chain: %v", err)
		}
	}
	if _, err := pcs.PckCertificateExtensions(leaf); err != nil {
		return nil, fmt.Errorf("TDX PCK certificate extensions: %v", err)
	}
	inters := x509.NewCertPool()
	inters.AddCert(inter)
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: o.Roots.intel, Intermediates: inters, CurrentTime: o.Now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return nil, fmt.Errorf("TDX PCK certificate does not chain to the Intel SGX Root CA of the %s roots: %v", o.Roots.Source, err)
	}
	qeRaw, err := tabi.EnclaveReportToAbiBytes(qerc.GetQeReport())
	if err != nil {
		return nil, fmt.Errorf("TDX QE report: %v", err)
	}
	sig, err := tabi.SignatureToDER(qerc.GetQeReportSignature())
	if err != nil {
		return nil, fmt.Errorf("TDX QE report signature: %v", err)
	}
	if err := leaf.CheckSignature(x509.ECDSAWithSHA256, qeRaw, sig); err != nil {
		return nil, fmt.Errorf("TDX QE report signature does not verify with the PCK certificate: %v", err)
	}
	ak := q.GetSignedData().GetEcdsaAttestationKey()
	want := sha256.Sum256(append(bytes.Clone(ak), qerc.GetQeAuthData().GetData()...))
	rd := qerc.GetQeReport().GetReportData()
	if len(rd) != 64 || !bytes.Equal(rd[:32], want[:]) || !bytes.Equal(rd[32:], make([]byte, 32)) {
		return nil, fmt.Errorf("TDX QE report data does not commit to the quote's attestation key")
	}
	akPub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append([]byte{4}, ak...))
	if err != nil {
		return nil, fmt.Errorf("TDX attestation key: %v", err)
	}
	hdr, err := tabi.HeaderToAbiBytes(q.GetHeader())
	if err != nil {
		return nil, fmt.Errorf("TDX quote header: %v", err)
	}
	body, err := tabi.TdQuoteBodyToAbiBytes(q.GetTdQuoteBody())
	if err != nil {
		return nil, fmt.Errorf("TDX quote body: %v", err)
	}
	qsig, err := tabi.SignatureToDER(q.GetSignedData().GetSignature())
	if err != nil {
		return nil, fmt.Errorf("TDX quote signature: %v", err)
	}
	digest := sha256.Sum256(append(hdr, body...))
	if !ecdsa.VerifyASN1(akPub, digest[:], qsig) {
		return nil, fmt.Errorf("TDX quote signature does not verify with the attestation key (header or body changed)")
	}
	// Checked last, on signed data only: a tampered quote is reported as
	// tampered, not as another enclave's.
	if err := checkTDQE(q); err != nil {
		return nil, err
	}
	used := chains[0]
	return used[len(used)-1], nil
}

func pckChain(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := data
	for i := 0; i < 3; i++ {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil || blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("TDX PCK chain: certificate %d of 3 missing or not PEM", i+1)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("TDX PCK chain: certificate %d: %v", i+1, err)
		}
		out = append(out, c)
	}
	if len(rest) != 0 && !bytes.Equal(rest, []byte{0}) {
		return nil, fmt.Errorf("TDX PCK chain: %d unexpected bytes after the third certificate", len(rest))
	}
	return out, nil
}

func checkIntelCert(c, parent *x509.Certificate, names []string) error {
	if c.Version != 3 || c.SignatureAlgorithm != x509.ECDSAWithSHA256 {
		return fmt.Errorf("%q: version %d, signature %v (want 3, ECDSA-SHA256)", c.Subject.CommonName, c.Version, c.SignatureAlgorithm)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		return fmt.Errorf("%q: key is not ECDSA P-256", c.Subject.CommonName)
	}
	ok := false
	for _, n := range names {
		ok = ok || c.Subject.CommonName == n
	}
	if !ok {
		return fmt.Errorf("subject %q, want %q", c.Subject.CommonName, names)
	}
	if !bytes.Equal(c.RawIssuer, parent.RawSubject) {
		return fmt.Errorf("%q: issuer is not %q", c.Subject.CommonName, parent.Subject.CommonName)
	}
	if err := c.CheckSignatureFrom(parent); err != nil {
		return fmt.Errorf("%q: not signed by %q: %v", c.Subject.CommonName, parent.Subject.CommonName, err)
	}
	return nil
}

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
	qe := q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetQeReport()
	r.field("qe_isvsvn", fmt.Sprint(qe.GetIsvSvn()))
	root, err := verifyTDXChain(q, o)
	if err != nil {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "%v", err)
		return nil
	}
	r.add(ClaimEvidence, StatusAffirming, "", "TDX quote v4 signed by the attestation key of Intel's TD quoting enclave (MRSIGNER %s, ISVPRODID %d, not debug), QE report signed by the PCK, PCK chain to %s; %s",
		short(intelTDQEMRSigner), intelTDQEProdID, anchorName(root, "the Intel SGX Root CA", o), revocationNotChecked)
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
	tdxTCBClaim(r, body, qe.GetIsvSvn(), ref)
	return body.GetReportData()
}

func tdxPolicyClaim(r *Result, q *tpb.QuoteV4, ref *TDXReference) {
	body := q.GetTdQuoteBody()
	var bad []string
	// The fixed bits of TDATTRIBUTES and XFAM (as go-tdx-guest's validate
	// checks them).
	if a := body.GetTdAttributes(); len(a) == 8 {
		if v := binary.LittleEndian.Uint64(a); v&^tdAttributesFixed0 != 0 {
			bad = append(bad, fmt.Sprintf("TDATTRIBUTES 0x%x sets bits outside 0x%x", v, uint64(tdAttributesFixed0)))
		}
	}
	if x := body.GetXfam(); len(x) == 8 {
		v := binary.LittleEndian.Uint64(x)
		if v&xfamFixed1 != xfamFixed1 || v&^xfamFixed0 != 0 {
			bad = append(bad, fmt.Sprintf("XFAM 0x%x violates its fixed bits (must set 0x%x, may set only 0x%x)", v, xfamFixed1, xfamFixed0))
		}
	}
	if ref == nil {
		ref = &TDXReference{}
	}
	// Each of TDATTRIBUTES, XFAM and MRSEAM is compared when the reference
	// values give it; else the claim says it was not.
	attrs, xfam, seam := hex.EncodeToString(body.GetTdAttributes()), hex.EncodeToString(body.GetXfam()), hex.EncodeToString(body.GetMrSeam())
	var checked, unchecked []string
	switch {
	case len(ref.TDAttributes) == 0:
		unchecked = append(unchecked, "TDATTRIBUTES "+attrs)
	case !anyEqual(body.GetTdAttributes(), []HexBytes{ref.TDAttributes}):
		bad = append(bad, fmt.Sprintf("TDATTRIBUTES %s, expected %s", attrs, hex.EncodeToString(ref.TDAttributes)))
	default:
		checked = append(checked, "TDATTRIBUTES "+attrs)
	}
	switch {
	case len(ref.XFAM) == 0:
		unchecked = append(unchecked, "XFAM "+xfam)
	case !anyEqual(body.GetXfam(), []HexBytes{ref.XFAM}):
		bad = append(bad, fmt.Sprintf("XFAM %s, expected %s", xfam, hex.EncodeToString(ref.XFAM)))
	default:
		checked = append(checked, "XFAM "+xfam)
	}
	switch {
	case len(ref.MRSeam) == 0:
		unchecked = append(unchecked, "MRSEAM "+seam)
	case !anyEqual(body.GetMrSeam(), ref.MRSeam):
		bad = append(bad, fmt.Sprintf("MRSEAM %s is not a reference value", seam))
	default:
		checked = append(checked, "MRSEAM "+seam)
	}
	switch {
	case len(bad) > 0:
		r.add(ClaimPolicy, StatusContraindicated, FailRefValue, "%s", join(bad))
	case len(unchecked) > 0:
		what := "fixed bits of TDATTRIBUTES and XFAM hold"
		if len(checked) > 0 {
			what = strings.Join(checked, ", ") + " match the reference values"
			if len(checked) == 1 {
				what = checked[0] + " matches the reference value"
			}
		}
		r.add(ClaimPolicy, StatusWarning, "", "%s; %s not checked (not in the reference values)", what, strings.Join(unchecked, ", "))
	default:
		r.add(ClaimPolicy, StatusAffirming, "", "%s match the reference values", strings.Join(checked, ", "))
	}
}

func tdxMeasurementClaims(r *Result, body *tpb.TDQuoteBody, ref *TDXReference) {
	// The claim names what was compared and what was not: an RTMR left ""
	// in the reference values is not checked, and neither is an absent MRTD.
	var bad, good, skipped []string
	if ref != nil && len(ref.MRTD) > 0 {
		if anyEqual(body.GetMrTd(), ref.MRTD) {
			good = append(good, "MRTD")
		} else {
			bad = append(bad, fmt.Sprintf("MRTD %s is not among the %d reference values", hex.EncodeToString(body.GetMrTd()), len(ref.MRTD)))
		}
	} else {
		skipped = append(skipped, "MRTD")
	}
	rtmrs := body.GetRtmrs()
	for i := range 4 {
		var want HexBytes
		if ref != nil && i < len(ref.RTMRs) {
			want = ref.RTMRs[i]
		}
		if len(want) == 0 {
			skipped = append(skipped, fmt.Sprintf("RTMR%d", i))
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
	matched := strings.Join(good, ", ") + " match the reference values"
	if len(good) == 1 {
		matched = good[0] + " matches the reference value"
	}
	notChecked := func(skipped []string) string {
		if len(skipped) == 0 {
			return ""
		}
		return "; " + strings.Join(skipped, ", ") + " not checked"
	}
	switch {
	case len(bad) > 0:
		r.add(ClaimMeasurement, StatusContraindicated, FailRefValue, "%s", join(bad))
	case len(good) == 0:
		r.add(ClaimMeasurement, StatusWarning, "", "no reference MRTD or RTMRs: MRTD %s not checked", hex.EncodeToString(body.GetMrTd()))
	case len(skipped) > 0 && skipped[0] == "MRTD":
		// The firmware measured into MRTD extends RTMR0 to 2: unpinned, it
		// could have written any values there, so matching RTMRs alone say
		// nothing about the code the TD runs.
		r.add(ClaimMeasurement, StatusWarning, "", "%s, but MRTD %s is not checked: firmware that is not pinned could have extended the RTMRs with any values%s",
			matched, hex.EncodeToString(body.GetMrTd()), notChecked(skipped[1:]))
	case len(skipped) > 0:
		// MRTD covers only the TD's initial memory (the firmware): the
		// RTMRs record what it booted (configuration, kernel, command line
		// and initrd) and what was measured after, the gateway included.
		r.add(ClaimMeasurement, StatusWarning, "", "%s%s: what they record (firmware configuration, kernel, command line, initrd, run-time measurements such as the gateway) could be anything", matched, notChecked(skipped))
	default:
		r.add(ClaimMeasurement, StatusAffirming, "", "%s", matched)
	}
	switch {
	case ref == nil || len(ref.MRConfigID) == 0:
		r.add(ClaimHostData, StatusWarning, "", "no mr_config_id in the reference values: MRCONFIGID %s not checked", hex.EncodeToString(body.GetMrConfigId()))
	case anyEqual(body.GetMrConfigId(), []HexBytes{ref.MRConfigID}):
		r.add(ClaimHostData, StatusAffirming, "", "MRCONFIGID matches the reference value")
	default:
		r.add(ClaimHostData, StatusContraindicated, FailRefValue, "MRCONFIGID %s, expected %s", hex.EncodeToString(body.GetMrConfigId()), hex.EncodeToString(ref.MRConfigID))
	}
}

func tdxTCBClaim(r *Result, body *tpb.TDQuoteBody, qeSVN uint32, ref *TDXReference) {
	// The quoting enclave's SVN is part of the TCB status too: which QE
	// SVNs are current is in Intel's TD_QE identity, which is collateral.
	offline := fmt.Sprintf("TCB status (UpToDate, OutOfDate, ...) of the platform and of the quoting enclave (ISVSVN %d) needs Intel PCS collateral and is not established offline", qeSVN)
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
