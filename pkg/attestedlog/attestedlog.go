// Package attestedlog checks the attestation evidence in a cmcp audit log:
// each epoch's genesis record carries evidence (pkg/evidence) that must bind
// the epoch's signing key and the genesis statement. With pkg/auditlog it
// gives a third party exactly the answer of `cmcp verify-chain`, with pkg/
// alone (see the example). It works offline.
package attestedlog

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// GenesisResult is what a GenesisCheck established about one epoch's key.
type GenesisResult struct {
	Epoch    int              `json:"epoch"`
	Platform string           `json:"platform"` // sev-snp, tdx, software, or none
	Attested bool             `json:"attested"` // the key is bound to SEV-SNP or TDX evidence that verified
	Verdict  string           `json:"verdict"`
	Binding  string           `json:"binding"`
	Claims   []evidence.Claim `json:"claims,omitempty"`
	Note     string           `json:"note,omitempty"`
}

// GenesisCheck checks the attestation evidence in the genesis record of
// each epoch of an audit log, as `cmcp verify-chain` does: the evidence must
// verify (against Options.Roots and Options.Reference) and bind the epoch's
// signing key and the genesis statement. Software or absent evidence is
// recorded as unattested, and fails with RequireAttested. Pass Check as
// auditlog.VerifyOptions.VerifyEvidence; Results then holds one entry per
// epoch. A GenesisCheck is not safe for concurrent use.
type GenesisCheck struct {
	// Options carries the roots and reference values; the expected key,
	// statement and AllowSoftware are set for each epoch.
	Options evidence.VerifyOptions
	// RequireAttested fails an epoch whose key is not bound to SEV-SNP or
	// TDX evidence that verified (verify-chain's --require-attested).
	RequireAttested bool
	// Results are the epochs checked so far, in order.
	Results []*GenesisResult
}

// NoteKeyPublic extracts the Ed25519 key from a note verifier key
// "name+hash+base64(0x01 || key)", the form of record.Genesis.Key.
func NoteKeyPublic(vkey string) (ed25519.PublicKey, error) {
	parts := strings.SplitN(vkey, "+", 3)
	if len(parts) != 3 {
		return nil, fmt.Errorf("genesis key %q is not name+hash+key", vkey)
	}
	raw, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(raw) != 1+ed25519.PublicKeySize || raw[0] != 1 {
		return nil, fmt.Errorf("genesis key %q is not an Ed25519 note key", vkey)
	}
	return ed25519.PublicKey(raw[1:]), nil
}

// Check is auditlog.VerifyOptions.VerifyEvidence: the genesis evidence must
// bind the epoch's signing key and the genesis statement.
func (c *GenesisCheck) Check(g *record.Genesis) error {
	ge := &GenesisResult{Epoch: g.Epoch, Platform: "none", Binding: evidence.BindingNotApplicable, Verdict: string(evidence.StatusWarning)}
	c.Results = append(c.Results, ge)
	if len(g.Evidence) == 0 {
		ge.Note = "the genesis record carries no attestation evidence: the key is unattested"
		if c.RequireAttested {
			return errors.New(ge.Note + " (--require-attested)")
		}
		if c.Options.Reference != nil {
			// Reference values are what the auditor expects of the platform;
			// with no evidence there is nothing they could be checked against.
			ge.Verdict = string(evidence.StatusContraindicated)
			return fmt.Errorf("epoch %d: %s, so the reference values (--reference) cannot be checked", g.Epoch, ge.Note)
		}
		return nil
	}
	b, err := evidence.Decode(g.Evidence)
	if err != nil {
		ge.Verdict = string(evidence.StatusContraindicated)
		return fmt.Errorf("epoch %d: %v", g.Epoch, err)
	}
	ge.Platform = b.Platform
	if g.Gateway.Platform != "" && g.Gateway.Platform != b.Platform {
		ge.Verdict = string(evidence.StatusContraindicated)
		return fmt.Errorf("epoch %d: the genesis says platform %q but its evidence is %q", g.Epoch, g.Gateway.Platform, b.Platform)
	}
	pub, err := NoteKeyPublic(g.Key)
	if err != nil {
		ge.Verdict = string(evidence.StatusContraindicated)
		return err
	}
	opts := c.Options
	opts.ExpectKey = pub
	opts.ExpectStatement = g.Statement
	opts.AllowSoftware = !c.RequireAttested
	res, err := evidence.Verify(b, opts)
	if err != nil {
		return err
	}
	ge.Verdict, ge.Binding, ge.Claims, ge.Attested = string(res.Verdict), res.Binding, res.Claims, res.Attested
	if !b.Attested {
		ge.Note = "software evidence: the key is unattested (development only)"
	} else if m := res.Claim(evidence.ClaimMeasurement); m != nil && m.Status == evidence.StatusWarning {
		ge.Note = c.unmeasuredNote(b.Platform)
	}
	if err := res.Err(); err != nil {
		if !b.Attested && c.RequireAttested {
			return fmt.Errorf("epoch %d: %v (--require-attested)", g.Epoch, err)
		}
		return fmt.Errorf("epoch %d: %v", g.Epoch, err)
	}
	return nil
}

// pinsPartOfMeasurement reports whether the reference values pin some but
// not all of platform's launch measurement: for TDX, MRTD or an RTMR but not
// MRTD and all four RTMRs (an SEV-SNP measurement is one value).
func (c *GenesisCheck) pinsPartOfMeasurement(platform string) bool {
	rv := c.Options.Reference
	if rv == nil || rv.TDX == nil || platform != evidence.PlatformTDX {
		return false
	}
	pinned := 0
	for _, m := range rv.TDX.RTMRs {
		if len(m) > 0 {
			pinned++
		}
	}
	return (len(rv.TDX.MRTD) > 0 || pinned > 0) && !(len(rv.TDX.MRTD) > 0 && pinned == 4)
}

const partialMeasurement = "the --reference values do not pin MRTD and all four RTMRs"

// unmeasuredNote says what genuine hardware evidence without a checked
// launch measurement proves: that the key lives in a genuine VM, not which
// code runs there.
func (c *GenesisCheck) unmeasuredNote(platform string) string {
	what := "launch measurement"
	if platform == evidence.PlatformTDX {
		what = "launch measurement (MRTD and RTMRs)"
	}
	checked, how := "NOT checked", "pass --reference with the expected values"
	switch {
	case c.pinsPartOfMeasurement(platform):
		checked, how = "NOT fully checked", partialMeasurement
	case c.Options.Reference != nil:
		how = "the --reference values pin none"
	}
	return fmt.Sprintf("%s %s against reference values, so any code in a genuine %s VM could hold this key: %s", what, checked, platform, how)
}

// UnmeasuredWarning is the one warning to give when RequireAttested passed
// although some epoch's launch measurement was not (fully) checked: it
// proves genuine hardware, not the gateway's code. It is "" otherwise.
func (c *GenesisCheck) UnmeasuredWarning() string {
	if !c.RequireAttested {
		return ""
	}
	var epochs []string
	partial := false
	for _, ge := range c.Results {
		if ge.Attested {
			if m := claimOf(ge.Claims, evidence.ClaimMeasurement); m != nil && m.Status == evidence.StatusWarning {
				epochs = append(epochs, fmt.Sprint(ge.Epoch))
				partial = partial || c.pinsPartOfMeasurement(ge.Platform)
			}
		}
	}
	if len(epochs) == 0 {
		return ""
	}
	checked, how := "NOT checked", "pass --reference with the expected measurements"
	switch {
	case partial:
		checked, how = "NOT fully checked", partialMeasurement
	case c.Options.Reference != nil:
		how = "the --reference values pin no launch measurement"
	}
	which := "the key of epoch " + epochs[0] + " is"
	if len(epochs) > 1 {
		which = "the keys of epochs " + strings.Join(epochs, ", ") + " are"
	}
	return fmt.Sprintf("--require-attested: %s bound to genuine hardware evidence, but the launch measurement was %s against reference values, so any code in a genuine VM could hold the key (%s)", which, checked, how)
}

func claimOf(claims []evidence.Claim, name string) *evidence.Claim {
	for i := range claims {
		if claims[i].Name == name {
			return &claims[i]
		}
	}
	return nil
}
