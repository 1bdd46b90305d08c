package evidence

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	svalidate "github.com/google/go-sev-guest/validate"
)

// SNPReportSize is the size of an SEV-SNP attestation report.
const SNPReportSize = abi.ReportSize

// ParseSNP parses a raw SEV-SNP report, optionally followed by its GHCB
// certificate table, into the go-sev-guest representation. extra are DER
// certificates supplied separately (a VCEK or VLEK); they fill in what the
// table lacks. An ARK or ASK among them is ignored: roots come from Roots.
// A report or table that makes the vendor parser panic is an error saying
// the report is malformed.
func ParseSNP(raw []byte, extra [][]byte) (att *spb.Attestation, err error) {
	err = recoverParse("SEV-SNP report", func() (err error) {
		att, err = parseSNP(raw, extra)
		return err
	})
	return att, err
}

func parseSNP(raw []byte, extra [][]byte) (*spb.Attestation, error) {
	if len(raw) < abi.ReportSize {
		return nil, fmt.Errorf("truncated SEV-SNP report: %d bytes, a report is %d", len(raw), abi.ReportSize)
	}
	if err := abi.ValidateReportFormat(raw[:abi.ReportSize]); err != nil {
		return nil, fmt.Errorf("SEV-SNP report: %v", err)
	}
	rep, err := abi.ReportToProto(raw[:abi.ReportSize])
	if err != nil {
		return nil, fmt.Errorf("SEV-SNP report: %v", err)
	}
	chain := &spb.CertificateChain{Extras: map[string][]byte{}}
	if table := raw[abi.ReportSize:]; len(table) > 0 {
		// go-sev-guest checks each entry's range with a uint32 sum that
		// overflows (and then slices out of range: a panic); check it here
		// in 64 bits first.
		hdr, err := abi.ParseSnpCertTableHeader(table)
		if err != nil {
			return nil, fmt.Errorf("SEV-SNP certificate table after the report: %v", err)
		}
		for i, e := range hdr {
			if uint64(e.Offset)+uint64(e.Length) > uint64(len(table)) {
				return nil, fmt.Errorf("SEV-SNP certificate table after the report: entry %d (%s) claims bytes %d to %d of a %d-byte table", i, e.GUID, e.Offset, uint64(e.Offset)+uint64(e.Length), len(table))
			}
		}
		var ct abi.CertTable
		if err := ct.Unmarshal(table); err != nil {
			return nil, fmt.Errorf("SEV-SNP certificate table after the report: %v", err)
		}
		// Built here rather than with CertTable.Proto, which logs to stdout
		// (through go-tdx-guest's logger setup) when no VCEK or VLEK is present.
		for _, e := range ct.Entries {
			switch strings.ToLower(e.GUID.String()) {
			case abi.VcekGUID:
				chain.VcekCert = e.RawCert
			case abi.VlekGUID:
				chain.VlekCert = e.RawCert
			case abi.AskGUID:
				chain.AskCert = e.RawCert
			case abi.ArkGUID:
				chain.ArkCert = e.RawCert
			default:
				chain.Extras[e.GUID.String()] = e.RawCert
			}
		}
	}
	for i, der := range extra {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %v", i+1, err)
		}
		switch c.Subject.CommonName {
		case "SEV-VCEK":
			if len(chain.VcekCert) == 0 {
				chain.VcekCert = der
			}
		case "SEV-VLEK":
			if len(chain.VlekCert) == 0 {
				chain.VlekCert = der
			}
		default:
			if !strings.HasPrefix(c.Subject.CommonName, "ARK-") && !strings.HasPrefix(c.Subject.CommonName, "SEV-") {
				return nil, fmt.Errorf("certificate %d (%q) is not an AMD VCEK or VLEK", i+1, c.Subject.CommonName)
			}
		}
	}
	return &spb.Attestation{Report: rep, CertificateChain: chain}, nil
}

// verifySNPChain checks the signing certificate the way AMD's KDS issues it
// (X.509 v3, RSASSA-PSS with SHA-384, an ECDSA P-384 key, the KDS
// extensions), its chain to the pinned ARK through the ASK (VCEK) or ASVK
// (VLEK) of the report's product line, its validity at o.Now, and the
// report's ECDSA P-384 signature over its first 0x2A0 bytes.
func verifySNPChain(report, keyDER []byte, key abi.ReportSigner, line string, o *VerifyOptions) error {
	cert, err := x509.ParseCertificate(keyDER)
	if err != nil {
		return fmt.Errorf("%v certificate: %v", key, err)
	}
	if cert.Version != 3 || cert.SignatureAlgorithm != x509.SHA384WithRSAPSS {
		return fmt.Errorf("%v certificate is not a KDS certificate: version %d, signature %v (want 3, SHA384-RSAPSS)", key, cert.Version, cert.SignatureAlgorithm)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P384() {
		return fmt.Errorf("%v certificate key is not ECDSA P-384", key)
	}
	if _, err := kds.CertificateExtensions(cert, key); err != nil {
		return fmt.Errorf("%v certificate extensions: %v", key, err)
	}
	if len(o.Roots.amd) == 0 {
		return fmt.Errorf("no AMD roots in %s", o.Roots.Source)
	}
	anchor := o.Roots.amd[line]
	if anchor == nil {
		return fmt.Errorf("no AMD root for product line %q in %s roots", line, o.Roots.Source)
	}
	ica := anchor.ask
	if key == abi.VlekReportSigner {
		ica = anchor.asvk
	}
	if ica == nil {
		return fmt.Errorf("the %s roots for %s have no intermediate for %v certificates", o.Roots.Source, line, key)
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(anchor.ark)
	inter.AddCert(ica)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: o.Now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("SEV-SNP %v certificate does not chain to ARK-%s of the %s roots: %v", key, line, o.Roots.Source, err)
	}
	der, err := abi.ReportToSignatureDER(report)
	if err != nil {
		return fmt.Errorf("SEV-SNP report signature: %v", err)
	}
	if abi.SignatureAlgo(report) != abi.SignEcdsaP384Sha384 {
		return fmt.Errorf("SEV-SNP report signature algorithm %d is not ECDSA P-384 with SHA-384", abi.SignatureAlgo(report))
	}
	if err := cert.CheckSignature(x509.ECDSAWithSHA384, abi.SignedComponent(report), der); err != nil {
		return fmt.Errorf("SEV-SNP report signature does not verify with the %v certificate: %v", key, err)
	}
	return nil
}

// revocationNotChecked is said of every verified chain: verification is
// offline and carries no CRL, so a revoked VCEK, VLEK, ASK, PCK or
// intermediate is not noticed.
const revocationNotChecked = "revocation not checked (offline, no CRL)"

// anchorName names the root a chain ended at for a claim: the vendor's root
// when it is one embedded in cmcp; else the certificate the auditor supplied
// (its name, file and fingerprint), so that a claim never credits the vendor
// for a root that only carries the vendor's name.
func anchorName(root *x509.Certificate, vendor string, o *VerifyOptions) string {
	if o.Roots.Source == EmbeddedSource {
		return vendor + " embedded in cmcp"
	}
	fp := sha256.Sum256(root.Raw)
	s := fmt.Sprintf("the root %q from %s (sha256:%s)", root.Subject.CommonName, o.Roots.Source, short(fp[:]))
	if embeddedRoot(root) {
		return s + ", the same certificate as " + vendor + " embedded in cmcp"
	}
	return s + ", which is not a root embedded in cmcp"
}

// embeddedRoot reports whether c is one of the roots embedded in cmcp.
func embeddedRoot(c *x509.Certificate) bool {
	e := Embedded()
	for _, a := range e.amd {
		if a.ark.Equal(c) {
			return true
		}
	}
	return slices.ContainsFunc(e.intelCerts, c.Equal)
}

func rootsClaim(r *Result, o *VerifyOptions) {
	if o.Roots.Source == EmbeddedSource {
		r.add(ClaimRoots, StatusAffirming, "", "vendor roots embedded in cmcp")
		return
	}
	r.add(ClaimRoots, StatusWarning, "", "roots from %s replace the embedded vendor roots", o.Roots.Source)
}

// verifySNP appraises an SEV-SNP report and returns its REPORT_DATA if the
// signature chain verified, else nil.
func verifySNP(r *Result, raw []byte, extra [][]byte, o *VerifyOptions) []byte {
	att, err := ParseSNP(raw, extra)
	if err != nil {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "%v", err)
		return nil
	}
	rep := att.GetReport()
	info, err := abi.ParseSignerInfo(rep.GetSignerInfo())
	if err != nil {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "SEV-SNP signer info: %v", err)
		return nil
	}
	signer := info.SigningKey.String()
	var keyDER []byte
	switch info.SigningKey {
	case abi.VcekReportSigner:
		keyDER = att.GetCertificateChain().GetVcekCert()
	case abi.VlekReportSigner:
		keyDER = att.GetCertificateChain().GetVlekCert()
	default:
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "report signed by %s: only VCEK and VLEK signed reports can be verified", signer)
		return nil
	}
	r.field("version", fmt.Sprint(rep.GetVersion()))
	r.field("signer", signer)
	r.field("measurement", hex.EncodeToString(rep.GetMeasurement()))
	r.field("host_data", hex.EncodeToString(rep.GetHostData()))
	r.field("report_data", hex.EncodeToString(rep.GetReportData()))
	r.field("policy", fmt.Sprintf("0x%x", rep.GetPolicy()))
	r.field("vmpl", fmt.Sprint(rep.GetVmpl()))
	r.field("chip_id", hex.EncodeToString(rep.GetChipId()))
	tcb := kds.DecomposeTCBVersion(kds.TCBVersion(rep.GetReportedTcb()))
	r.field("reported_tcb", tcbString(tcb))
	if len(keyDER) == 0 {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "no %s certificate in the evidence: pass it with --cert (from the host's certificate table or AMD KDS)", signer)
		return nil
	}
	line := productLine(rep, keyDER, info.SigningKey)
	r.field("product_line", line)
	if err := verifySNPChain(raw[:abi.ReportSize], keyDER, info.SigningKey, line, o); err != nil {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "%v", err)
		return nil
	}
	// Consistency of the report with its signing certificate: REPORTED_TCB
	// equals the certificate's TCB, CHIP_ID its HWID, committed TCB current.
	permissive := &svalidate.Options{GuestPolicy: abi.SnpPolicy{Debug: true, MigrateMA: true, SMT: true, CXLAllowed: true}}
	if err := svalidate.SnpAttestation(att, permissive); err != nil {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "SEV-SNP report is inconsistent with its %s: %v", signer, err)
		return nil
	}
	r.add(ClaimEvidence, StatusAffirming, "", "SEV-SNP report v%d signed by %s, chain to %s; %s",
		rep.GetVersion(), signer, anchorName(o.Roots.amd[line].ark, "AMD ARK-"+line, o), revocationNotChecked)
	rootsClaim(r, o)

	policy, err := abi.ParseSnpPolicy(rep.GetPolicy())
	if err != nil { // ReportToProto already parsed it
		r.add(ClaimPolicy, StatusContraindicated, FailRefValue, "guest policy: %v", err)
		return rep.GetReportData()
	}
	if policy.Debug {
		r.add(ClaimDebug, StatusContraindicated, FailRefValue, "guest policy 0x%x allows debugging: the host can read and change guest memory", rep.GetPolicy())
	} else {
		r.add(ClaimDebug, StatusAffirming, "", "debugging disabled by the guest policy")
	}
	var ref *SNPReference
	if o.Reference != nil {
		ref = o.Reference.SEVSNP
	}
	snpPolicyClaim(r, rep, policy, ref)
	snpMeasurementClaims(r, rep, ref)
	snpTCBClaim(r, tcb, ref)
	return rep.GetReportData()
}

func snpPolicyClaim(r *Result, rep *spb.Report, policy abi.SnpPolicy, ref *SNPReference) {
	var bad, unchecked []string
	allowMA, allowSMT := false, true
	var vmpl *uint32
	var minSVN uint32
	if ref != nil {
		allowMA = ref.AllowMigrateMA
		if ref.AllowSMT != nil {
			allowSMT = *ref.AllowSMT
		}
		vmpl, minSVN = ref.VMPL, ref.MinimumGuestSVN
	}
	checked := fmt.Sprintf("migration agent %s, SMT %s", onOff(policy.MigrateMA), onOff(policy.SMT))
	switch {
	case vmpl == nil:
		unchecked = append(unchecked, fmt.Sprintf("VMPL %d not checked (no vmpl in the reference values)", rep.GetVmpl()))
	case rep.GetVmpl() != *vmpl:
		bad = append(bad, fmt.Sprintf("VMPL %d, expected %d", rep.GetVmpl(), *vmpl))
	default:
		checked += fmt.Sprintf(", VMPL %d", rep.GetVmpl())
	}
	// A minimum of 0 admits every GUEST_SVN: it checks nothing.
	switch {
	case minSVN == 0:
		unchecked = append(unchecked, fmt.Sprintf("GUEST_SVN %d not checked (no minimum_guest_svn above 0 in the reference values)", rep.GetGuestSvn()))
	case rep.GetGuestSvn() < minSVN:
		bad = append(bad, fmt.Sprintf("GUEST_SVN %d below the minimum %d", rep.GetGuestSvn(), minSVN))
	default:
		checked += fmt.Sprintf(", GUEST_SVN %d meets the minimum %d", rep.GetGuestSvn(), minSVN)
	}
	if policy.MigrateMA && !allowMA {
		bad = append(bad, "a migration agent is allowed (allow_migrate_ma is not set)")
	}
	if policy.SMT && !allowSMT {
		bad = append(bad, "SMT is allowed (allow_smt is false)")
	}
	switch {
	case len(bad) > 0:
		r.add(ClaimPolicy, StatusContraindicated, FailRefValue, "guest policy 0x%x: %s", rep.GetPolicy(), join(bad))
	case len(unchecked) > 0:
		r.add(ClaimPolicy, StatusWarning, "", "guest policy 0x%x: %s; %s", rep.GetPolicy(), checked, join(unchecked))
	default:
		r.add(ClaimPolicy, StatusAffirming, "", "guest policy 0x%x: %s", rep.GetPolicy(), checked)
	}
}

func snpMeasurementClaims(r *Result, rep *spb.Report, ref *SNPReference) {
	m := rep.GetMeasurement()
	switch {
	case ref == nil || len(ref.Measurements) == 0:
		r.add(ClaimMeasurement, StatusWarning, "", "no reference measurements: launch measurement %s not checked", hex.EncodeToString(m))
	case anyEqual(m, ref.Measurements):
		r.add(ClaimMeasurement, StatusAffirming, "", "launch measurement %s is a reference value", hex.EncodeToString(m))
	default:
		r.add(ClaimMeasurement, StatusContraindicated, FailRefValue, "launch measurement %s is not among the %d reference values", hex.EncodeToString(m), len(ref.Measurements))
	}
	switch {
	case ref == nil || len(ref.HostData) == 0:
		r.add(ClaimHostData, StatusWarning, "", "no host_data in the reference values: HOST_DATA %s not checked", hex.EncodeToString(rep.GetHostData()))
	case anyEqual(rep.GetHostData(), []HexBytes{ref.HostData}):
		r.add(ClaimHostData, StatusAffirming, "", "HOST_DATA matches the reference value")
	default:
		r.add(ClaimHostData, StatusContraindicated, FailRefValue, "HOST_DATA %s, expected %s", hex.EncodeToString(rep.GetHostData()), hex.EncodeToString(ref.HostData))
	}
}

func snpTCBClaim(r *Result, tcb kds.TCBParts, ref *SNPReference) {
	if ref == nil || ref.MinimumTCB == nil {
		r.add(ClaimTCB, StatusWarning, "", "no minimum TCB in the reference values: reported TCB %s; whether it is current cannot be established offline", tcbString(tcb))
		return
	}
	min := ref.MinimumTCB
	var low []string
	for _, p := range []struct {
		name     string
		got, min uint8
	}{{"bootloader", tcb.BlSpl, min.Bootloader}, {"tee", tcb.TeeSpl, min.TEE}, {"snp", tcb.SnpSpl, min.SNP}, {"microcode", tcb.UcodeSpl, min.Microcode}} {
		if p.got < p.min {
			low = append(low, fmt.Sprintf("%s %d < %d", p.name, p.got, p.min))
		}
	}
	if len(low) > 0 {
		r.add(ClaimTCB, StatusContraindicated, FailRefValue, "reported TCB below the minimum: %s", join(low))
		return
	}
	// Meeting the minimum is established offline, but whether this TCB is
	// AMD's current one is not: the rule is that such status is a
	// warning, never affirming (the same as TDX).
	r.add(ClaimTCB, StatusWarning, "", "reported TCB %s meets the minimum bootloader %d, tee %d, snp %d, microcode %d; whether it is current cannot be established offline", tcbString(tcb), min.Bootloader, min.TEE, min.SNP, min.Microcode)
}

func tcbString(t kds.TCBParts) string {
	return fmt.Sprintf("bootloader %d, tee %d, snp %d, microcode %d", t.BlSpl, t.TeeSpl, t.SnpSpl, t.UcodeSpl)
}

func onOff(b bool) string {
	if b {
		return "allowed"
	}
	return "off"
}

// productLine names the AMD product line from the report (v3+) or from the
// signing certificate's product-name extension (v2).
func productLine(rep *spb.Report, keyDER []byte, key abi.ReportSigner) string {
	if fms := rep.GetCpuid1EaxFms(); fms != 0 {
		return kds.ProductLineFromFms(fms)
	}
	c, err := x509.ParseCertificate(keyDER)
	if err != nil {
		return "unknown"
	}
	exts, err := kds.CertificateExtensions(c, key)
	if err != nil {
		return "unknown"
	}
	return kds.ProductLineOfProductName(exts.ProductName)
}
