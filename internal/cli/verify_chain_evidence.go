package cli

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/ui"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// chainEvidenceOptions are verify-chain's flags for the attestation evidence
// in each epoch's genesis record.
type chainEvidenceOptions struct {
	Roots           string
	Reference       string
	RequireAttested bool
}

func (o *chainEvidenceOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Roots, "roots", "", "PEM roots replacing the embedded AMD and Intel roots for the genesis evidence")
	fs.StringVar(&o.Reference, "reference", "", "reference values JSON for the genesis evidence (see 'cmcp attest verify')")
	fs.BoolVar(&o.RequireAttested, "require-attested", false, "fail unless every epoch's key is bound to verified SEV-SNP or TDX evidence (software or missing evidence fails), and every record of an earlier epoch is signed by its key (--require-signed); this proves genuine hardware, not the code: unless --reference pins the whole launch measurement (SEV-SNP measurements; TDX mr_td and all four rtmrs) any code in a genuine VM could hold the key (a warning says so)")
}

// genesisEvidence is what verify-chain established about one epoch's key.
type genesisEvidence struct {
	Epoch    int              `json:"epoch"`
	Platform string           `json:"platform"` // sev-snp, tdx, software, or none
	Attested bool             `json:"attested"` // the key is bound to SEV-SNP or TDX evidence that verified
	Verdict  string           `json:"verdict"`
	Binding  string           `json:"binding"`
	Claims   []evidence.Claim `json:"claims,omitempty"`
	Note     string           `json:"note,omitempty"`
}

type chainEvidence struct {
	opts    evidence.VerifyOptions
	require bool
	Results []*genesisEvidence
}

func newChainEvidence(o *chainEvidenceOptions) (*chainEvidence, error) {
	c := &chainEvidence{require: o.RequireAttested, Results: []*genesisEvidence{}}
	if o.Roots != "" {
		data, err := readInput(o.Roots)
		if err != nil {
			return nil, exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--roots: %w", err))
		}
		if c.opts.Roots, err = evidence.ParseRoots(data, o.Roots); err != nil {
			return nil, exitcode.Errorf(exitcode.ExitUsage, "--roots %s: %v", o.Roots, err)
		}
	}
	if o.Reference != "" {
		rv, err := evidence.ReadReferenceFile(o.Reference)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil, exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--reference: %w", err))
			}
			return nil, exitcode.WithCode(exitcode.ExitUsage, fmt.Errorf("--reference: %w", err))
		}
		c.opts.Reference = rv
	}
	return c, nil
}

// noteKeyPublic extracts the Ed25519 key from a note verifier key
// "name+hash+base64(0x01 || key)".
func noteKeyPublic(vkey string) (ed25519.PublicKey, error) {
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

// check is auditlog.VerifyOptions.VerifyEvidence: the genesis evidence must
// bind the epoch's signing key and the genesis statement. Software or absent
// evidence is recorded as unattested (a failure with --require-attested).
func (c *chainEvidence) check(g *auditlog.Genesis) error {
	ge := &genesisEvidence{Epoch: g.Epoch, Platform: "none", Binding: evidence.BindingNotApplicable, Verdict: string(evidence.StatusWarning)}
	c.Results = append(c.Results, ge)
	if len(g.Evidence) == 0 {
		ge.Note = "the genesis record carries no attestation evidence: the key is unattested"
		if c.require {
			return errors.New(ge.Note + " (--require-attested)")
		}
		if c.opts.Reference != nil {
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
	pub, err := noteKeyPublic(g.Key)
	if err != nil {
		ge.Verdict = string(evidence.StatusContraindicated)
		return err
	}
	opts := c.opts
	opts.ExpectKey = pub
	opts.ExpectStatement = g.Statement
	opts.AllowSoftware = !c.require
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
		if !b.Attested && c.require {
			return fmt.Errorf("epoch %d: %v (--require-attested)", g.Epoch, err)
		}
		return fmt.Errorf("epoch %d: %v", g.Epoch, err)
	}
	return nil
}

// pinsPartOfMeasurement reports whether the reference values pin some but
// not all of platform's launch measurement: for TDX, MRTD or an RTMR but not
// MRTD and all four RTMRs (an SEV-SNP measurement is one value).
func (c *chainEvidence) pinsPartOfMeasurement(platform string) bool {
	rv := c.opts.Reference
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
func (c *chainEvidence) unmeasuredNote(platform string) string {
	what := "launch measurement"
	if platform == evidence.PlatformTDX {
		what = "launch measurement (MRTD and RTMRs)"
	}
	checked, how := "NOT checked", "pass --reference with the expected values"
	switch {
	case c.pinsPartOfMeasurement(platform):
		checked, how = "NOT fully checked", partialMeasurement
	case c.opts.Reference != nil:
		how = "the --reference values pin none"
	}
	return fmt.Sprintf("%s %s against reference values, so any code in a genuine %s VM could hold this key: %s", what, checked, platform, how)
}

// unmeasuredWarning is the one warning verify-chain gives when
// --require-attested passed although some epoch's launch measurement was not
// (fully) checked: the flag proves genuine hardware, not the gateway's code.
func (c *chainEvidence) unmeasuredWarning() string {
	if !c.require {
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
	case c.opts.Reference != nil:
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

// print writes one line per epoch after the chain report.
func (c *chainEvidence) print(p *ui.Printer) {
	for _, ge := range c.Results {
		switch {
		case ge.Platform == "none":
			p.Printf("  %s epoch %d: %s\n", p.Warn("!"), ge.Epoch, ge.Note)
		case ge.Platform == evidence.PlatformSoftware:
			p.Printf("  %s epoch %d: key and genesis statement bound by %s evidence: UNATTESTED, development only\n", p.Warn("!"), ge.Epoch, p.Warn("software"))
		default:
			mark := p.OK("✓")
			if ge.Verdict != string(evidence.StatusAffirming) {
				mark = p.Warn("!")
			}
			var warns []string
			for _, cl := range ge.Claims {
				if cl.Status == evidence.StatusWarning {
					warns = append(warns, cl.Name)
				}
			}
			extra := ""
			if len(warns) > 0 {
				extra = " (warnings: " + strings.Join(warns, ", ") + "; see 'cmcp attest verify')"
			}
			if ge.Note != "" {
				extra += "; " + ge.Note
			}
			p.Printf("  %s epoch %d: key and genesis statement bound by verified %s evidence, verdict %s%s\n", mark, ge.Epoch, ge.Platform, ge.Verdict, extra)
		}
	}
}
