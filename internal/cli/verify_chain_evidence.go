package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/ui"
	"github.com/confidential-mcp/cmcp/pkg/attestedlog"
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

// chainEvidence checks each epoch's genesis evidence (attestedlog.GenesisCheck,
// so a third party gets the same answer from pkg/ alone) and prints it.
type chainEvidence struct {
	attestedlog.GenesisCheck
}

func newChainEvidence(o *chainEvidenceOptions) (*chainEvidence, error) {
	c := &chainEvidence{attestedlog.GenesisCheck{RequireAttested: o.RequireAttested, Results: []*attestedlog.GenesisResult{}}}
	if o.Roots != "" {
		data, err := readInput(o.Roots)
		if err != nil {
			return nil, exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--roots: %w", err))
		}
		if c.Options.Roots, err = evidence.ParseRoots(data, o.Roots); err != nil {
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
		c.Options.Reference = rv
	}
	return c, nil
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
