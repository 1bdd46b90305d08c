package evidence

import (
	"crypto/ed25519"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// VerifyOptions say what to trust and what to expect.
type VerifyOptions struct {
	// Roots are the trust anchors; nil means Embedded().
	Roots *Roots
	// Reference values; nil leaves measurement, host data and TCB unchecked (warnings).
	Reference *ReferenceValues
	// ExpectNonce, when set, must equal the bound nonce (freshness).
	ExpectNonce []byte
	// ExpectKey, when set, must equal the bound key.
	ExpectKey ed25519.PublicKey
	// ExpectStatement, when set, must equal the bound statement digest.
	ExpectStatement digest.Digest
	// AllowSoftware turns the rejection of software evidence into a warning.
	// Software evidence is never affirming.
	AllowSoftware bool
	// Now is the time certificates must be valid at (default time.Now()).
	Now time.Time
}

func (o *VerifyOptions) defaults() VerifyOptions {
	v := *o
	if v.Roots == nil {
		v.Roots = Embedded()
	}
	if v.Now.IsZero() {
		v.Now = time.Now()
	}
	return v
}

// Verify appraises a bundle offline. The returned Result always lists the
// claims; Result.Err() is non-nil when the verdict is contraindicated. The
// error return is only for unusable options.
func Verify(b *Bundle, opts VerifyOptions) (*Result, error) {
	if b == nil {
		return nil, errors.New("no bundle")
	}
	o := opts.defaults()
	r := &Result{Platform: b.Platform, Roots: o.Roots.Source, VerifiedAt: o.Now.UTC()}
	if err := b.check(); err != nil {
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "%v", err)
		r.finish()
		return r, nil
	}
	var hwReportData []byte
	switch b.Platform {
	case PlatformSoftware:
		st := StatusContraindicated
		if o.AllowSoftware {
			st = StatusWarning
		}
		r.add(ClaimEvidence, st, FailEvidence, "software evidence: no hardware attestation, the key is unattested (development only)")
		hwReportData = b.Binding.ReportData
	case PlatformSEVSNP:
		hwReportData = verifySNP(r, b.Evidence.Data, b.Evidence.Certificates, &o)
	case PlatformTDX:
		hwReportData = verifyTDX(r, b.Evidence.Data, &o)
	}
	referenceCoversPlatform(r, b.Platform, &o)
	if hwReportData != nil {
		checkBinding(r, hwReportData, b, &o)
	}
	r.finish()
	return r, nil
}

// VerifyRaw appraises evidence that cmcp did not produce: a raw SEV-SNP
// report (1184 bytes, optionally followed by its certificate table) with its
// VCEK or VLEK among certs (PEM or DER), or a raw TDX quote version 4 with its
// embedded PCK chain. The binding is reported as not applicable.
func VerifyRaw(raw []byte, certs [][]byte, opts VerifyOptions) (*Result, error) {
	o := opts.defaults()
	r := &Result{Roots: o.Roots.Source, VerifiedAt: o.Now.UTC(), Binding: BindingNotApplicable}
	var rd []byte
	switch DetectRaw(raw) {
	case PlatformTDX:
		r.Platform = PlatformTDX
		if len(certs) > 0 {
			return nil, errors.New("a TDX quote carries its own PCK chain: --cert is only for SEV-SNP reports")
		}
		rd = verifyTDX(r, raw, &o)
	case PlatformSEVSNP:
		r.Platform = PlatformSEVSNP
		var ders [][]byte
		for i, c := range certs {
			parsed, err := ParseCertificates(c)
			if err != nil {
				// A certificate that does not parse is bad evidence (it
				// came with the report), not a usage error.
				r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "certificate %d of %d given with the report: %v", i+1, len(certs), err)
				r.finish()
				return r, nil
			}
			for _, p := range parsed {
				ders = append(ders, p.Raw)
			}
		}
		rd = verifySNP(r, raw, ders, &o)
	default:
		r.add(ClaimEvidence, StatusContraindicated, FailEvidence, "%s", describeUnknownRaw(raw))
		r.finish()
		return r, nil
	}
	referenceCoversPlatform(r, r.Platform, &o)
	if rd != nil {
		r.add(ClaimBinding, StatusNone, "", "not applicable: raw evidence carries no cmcp binding (report data %s)", hex.EncodeToString(rd))
	}
	r.finish()
	return r, nil
}

// DetectRaw names the platform of raw evidence by its header: a TDX quote v4
// (version 4, TEE type 0x81) or an SEV-SNP report (version 2 to 5, at least
// 1184 bytes). It returns "" for anything else.
func DetectRaw(raw []byte) string {
	if len(raw) >= 8 && binary.LittleEndian.Uint16(raw[0:2]) == 4 && binary.LittleEndian.Uint32(raw[4:8]) == 0x81 {
		return PlatformTDX
	}
	if len(raw) >= 4 {
		if v := binary.LittleEndian.Uint32(raw[0:4]); v >= 2 && v <= 5 {
			return PlatformSEVSNP
		}
	}
	return ""
}

func describeUnknownRaw(raw []byte) string {
	switch {
	case len(raw) == 0:
		return "empty file: want a raw SEV-SNP report or TDX quote"
	case len(raw) >= 2 && binary.LittleEndian.Uint16(raw[0:2]) == 4:
		return "version 4 quote whose TEE type is not TDX (0x81): want a raw SEV-SNP report or TDX quote"
	case len(raw) >= 2 && (binary.LittleEndian.Uint16(raw[0:2]) == 3 || binary.LittleEndian.Uint16(raw[0:2]) == 5):
		return fmt.Sprintf("quote version %d is not supported: want a TDX quote version 4 or a raw SEV-SNP report", binary.LittleEndian.Uint16(raw[0:2]))
	case len(raw) > 0 && raw[0] == '{':
		return "this is JSON: verify a cmcp evidence bundle without --raw-report"
	}
	return fmt.Sprintf("not a raw SEV-SNP report (version 2-5) or TDX quote (version 4): first bytes %s", hex.EncodeToString(raw[:min(8, len(raw))]))
}

// checkBinding compares the report data in the evidence with the binding of
// the bundle's key, nonce and statement, and those with what the verifier
// expects.
func checkBinding(r *Result, hwReportData []byte, b *Bundle, o *VerifyOptions) {
	bd := b.Binding
	want, err := ReportData(ed25519.PublicKey(bd.PublicKey), bd.Nonce, bd.Statement)
	switch {
	case err != nil:
		r.Binding = BindingMismatch
		r.add(ClaimBinding, StatusContraindicated, FailBinding, "binding inputs unusable: %v", err)
		return
	case subtle.ConstantTimeCompare(hwReportData, want[:]) != 1:
		r.Binding = BindingMismatch
		r.add(ClaimBinding, StatusContraindicated, FailBinding, "report data %s is not the binding of the bundle's key, nonce and statement (%s)", short(hwReportData), short(want[:]))
		return
	case subtle.ConstantTimeCompare(bd.ReportData, want[:]) != 1:
		r.Binding = BindingMismatch
		r.add(ClaimBinding, StatusContraindicated, FailBinding, "the bundle's report_data field %s does not match its key, nonce and statement", short(bd.ReportData))
		return
	}
	r.Binding = BindingOurs
	keyB64 := base64.StdEncoding.EncodeToString(bd.PublicKey)
	r.field("public_key", "ed25519:"+keyB64)
	r.field("nonce", hex.EncodeToString(bd.Nonce))
	if !bd.Statement.IsZero() {
		r.field("statement", bd.Statement.String())
	}
	var problems []string
	if o.ExpectKey != nil && subtle.ConstantTimeCompare(o.ExpectKey, bd.PublicKey) != 1 {
		problems = append(problems, fmt.Sprintf("bound key ed25519:%s is not the expected key ed25519:%s", keyB64, base64.StdEncoding.EncodeToString(o.ExpectKey)))
	}
	if !o.ExpectStatement.IsZero() && !o.ExpectStatement.Equal(bd.Statement) {
		got := bd.Statement.String()
		if got == "" {
			got = "no statement"
		}
		problems = append(problems, fmt.Sprintf("bound statement %s is not the expected %s", got, o.ExpectStatement))
	}
	if len(problems) > 0 {
		r.Binding = BindingMismatch
		r.add(ClaimBinding, StatusContraindicated, FailBinding, "%s", join(problems))
	} else {
		what := "key ed25519:" + keyB64
		if !bd.Statement.IsZero() {
			what += ", statement " + bd.Statement.String()
		}
		what += ", nonce " + short(bd.Nonce)
		// The binding holds either way; but without an expected key the key
		// is only the bundle's own, which whoever made the bundle chose.
		var unchecked []string
		if o.ExpectKey == nil {
			unchecked = append(unchecked, "key")
		}
		if o.ExpectStatement.IsZero() && !bd.Statement.IsZero() {
			unchecked = append(unchecked, "statement")
		}
		if len(unchecked) > 0 {
			what += fmt.Sprintf("; no expected %s given: the bundle's own, not compared with the one you expect", strings.Join(unchecked, " or "))
		}
		r.add(ClaimBinding, StatusAffirming, "", "report data binds %s", what)
	}
	switch {
	case o.ExpectNonce == nil:
		r.add(ClaimFreshness, StatusWarning, "", "no expected nonce given: freshness not established (bound nonce %s)", short(bd.Nonce))
	case subtle.ConstantTimeCompare(o.ExpectNonce, bd.Nonce) != 1:
		r.add(ClaimFreshness, StatusContraindicated, FailBinding, "bound nonce %s is not the expected nonce %s (replayed or other evidence)", short(bd.Nonce), short(o.ExpectNonce))
	default:
		r.add(ClaimFreshness, StatusAffirming, "", "bound nonce is the expected nonce")
	}
}

// malformedError is evidence that does not parse: its bytes are not what the
// TDX module, quoting enclave or AMD secure processor writes.
type malformedError struct {
	what string // "TDX quote", "SEV-SNP report"
	err  error
}

func (e *malformedError) Error() string {
	return fmt.Sprintf("the %s is malformed: %v (damaged or altered after the platform produced it; obtain the evidence again from its source)", e.what, e.err)
}

func (e *malformedError) Unwrap() error { return e.err }

func malformed(what string, err error) error { return &malformedError{what: what, err: err} }

// recoverParse runs a vendor parser; a panic in it (bytes its own checks did
// not foresee) becomes a malformed-evidence error instead of a crash.
func recoverParse(what string, parse func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = malformed(what, fmt.Errorf("the vendor parser failed on it: %v", p))
		}
	}()
	return parse()
}

func short(b []byte) string {
	h := hex.EncodeToString(b)
	if len(h) > 24 {
		return h[:16] + "…" + h[len(h)-8:]
	}
	if h == "" {
		return "(empty)"
	}
	return h
}

func join(s []string) string {
	out := ""
	for i, p := range s {
		if i > 0 {
			out += "; "
		}
		out += p
	}
	return out
}

// anyEqual reports whether v equals one of list, in constant time per entry.
func anyEqual(v []byte, list []HexBytes) bool {
	ok := 0
	for _, w := range list {
		ok |= subtle.ConstantTimeCompare(v, w)
	}
	return ok == 1
}

// referenceCoversPlatform rejects evidence whose platform has no section in
// the reference values given. Reference values are what the auditor expects:
// a file that pins only SEV-SNP measurements must not let a TDX quote (or
// software evidence) through with a mere "no reference measurements"
// warning, which would leave the auditor's values unenforced.
func referenceCoversPlatform(r *Result, platform string, o *VerifyOptions) {
	rv := o.Reference
	if rv == nil {
		return
	}
	var have []string
	if rv.SEVSNP != nil {
		have = append(have, PlatformSEVSNP)
	}
	if rv.TDX != nil {
		have = append(have, PlatformTDX)
	}
	if slices.Contains(have, platform) {
		return
	}
	reason := fmt.Sprintf("the reference values have no %q section (they cover %s only): %s evidence cannot match them",
		platform, strings.Join(have, " and "), platform)
	// It replaces the "no reference measurements" warning of the platform
	// check, so that there is one measurement claim.
	for i := range r.Claims {
		if r.Claims[i].Name == ClaimMeasurement {
			r.Claims[i] = Claim{Name: ClaimMeasurement, Status: StatusContraindicated, Reason: reason, Failure: FailRefValue}
			return
		}
	}
	r.add(ClaimMeasurement, StatusContraindicated, FailRefValue, "%s", reason)
}
