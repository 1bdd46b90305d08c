package cli

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/tee"
	"github.com/confidential-mcp/cmcp/internal/ui"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// nonceFlags are --nonce HEX and --nonce-file FILE, shared by attest and verify.
type nonceFlags struct {
	Hex  string
	File string
}

func (n *nonceFlags) add(fs *pflag.FlagSet, what string) {
	fs.StringVar(&n.Hex, "nonce", "", what+" nonce, in hex (at most 1024 bytes)")
	fs.StringVar(&n.File, "nonce-file", "", what+" nonce: the raw bytes of this file")
}

// get returns the nonce, or nil when neither flag was given.
func (n *nonceFlags) get() ([]byte, error) {
	switch {
	case n.Hex != "" && n.File != "":
		return nil, exitcode.Errorf(exitcode.ExitUsage, "give --nonce or --nonce-file, not both")
	case n.Hex != "":
		b, err := hex.DecodeString(strings.TrimPrefix(n.Hex, "0x"))
		if err != nil {
			return nil, exitcode.Errorf(exitcode.ExitUsage, "--nonce: not hex: %v", err)
		}
		if len(b) == 0 || len(b) > evidence.MaxNonceSize {
			return nil, exitcode.Errorf(exitcode.ExitUsage, "--nonce: %d bytes, want 1 to %d", len(b), evidence.MaxNonceSize)
		}
		return b, nil
	case n.File != "":
		b, err := readInput(n.File)
		if err != nil {
			return nil, exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--nonce-file: %w", err))
		}
		if len(b) == 0 || len(b) > evidence.MaxNonceSize {
			return nil, exitcode.Errorf(exitcode.ExitUsage, "--nonce-file %s: %d bytes, want 1 to %d", n.File, len(b), evidence.MaxNonceSize)
		}
		return b, nil
	}
	return nil, nil
}

func readPublicKey(path string) (ed25519.PublicKey, error) {
	// The help promises "ed25519:<base64>" and hex: accept them inline
	// too, when no file has that name. Never raw bytes inline: a mistyped
	// 32-character file name must not become a key.
	if _, serr := os.Stat(path); errors.Is(serr, fs.ErrNotExist) && (strings.HasPrefix(path, "ed25519:") || isHex64(path)) {
		pub, err := evidence.ParsePublicKey([]byte(path))
		if err != nil {
			return nil, exitcode.Errorf(exitcode.ExitUsage, "--key %s: %v", path, err)
		}
		return pub, nil
	}
	data, err := readInput(path)
	if err != nil {
		return nil, exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--key: %w", err))
	}
	pub, err := evidence.ParsePublicKey(data)
	if err != nil {
		return nil, exitcode.Errorf(exitcode.ExitUsage, "--key %s: %v", path, err)
	}
	return pub, nil
}

func parseStatement(s string) (digest.Digest, error) {
	if s == "" {
		return digest.Digest{}, nil
	}
	d, err := digest.Parse(s)
	if err != nil {
		return digest.Digest{}, exitcode.Errorf(exitcode.ExitUsage, "--statement: %v", err)
	}
	return d, nil
}

type attestOptions struct {
	Nonce     nonceFlags
	Key       string
	KeyOut    string
	Statement string
	Out       string
	Provider  string
	Certs     []string
}

func (o *attestOptions) AddFlags(fs *pflag.FlagSet) {
	o.Nonce.add(fs, "the verifier's")
	fs.StringVar(&o.Key, "key", "", "public key to bind: a FILE (PEM, ed25519:<base64>, hex or raw) or inline ed25519:<base64> or 64 hex digits; default: generate a new key")
	fs.StringVar(&o.KeyOut, "key-out", "cmcp-attest-key.pem", "where a generated private key is written (mode 0600, never overwritten)")
	fs.StringVar(&o.Statement, "statement", "", "statement digest to bind (sha256:<hex>), e.g. the audit log's genesis digest")
	fs.StringVarP(&o.Out, "out", "O", "cmcp-evidence.json", "where the evidence bundle is written")
	fs.StringVar(&o.Provider, "provider", tee.Auto, "evidence provider: auto, sev-snp, tdx or software (development only, unattested)")
	fs.StringArrayVar(&o.Certs, "cert", nil, "SEV-SNP: VCEK or VLEK certificate (PEM or DER) to include when the host supplies none (repeatable)")
}

type attestDoc struct {
	SchemaVersion int    `json:"schema_version"`
	Out           string `json:"out"`
	Platform      string `json:"platform"`
	Attested      bool   `json:"attested"`
	Collector     string `json:"collector"`
	PublicKey     string `json:"public_key"`
	KeyFile       string `json:"private_key_file,omitempty"`
	Nonce         string `json:"nonce"`
	Statement     string `json:"statement,omitempty"`
	ReportData    string `json:"report_data"`
}

func newAttestCmd(e *env) *cobra.Command {
	o := &attestOptions{}
	cmd := &cobra.Command{
		Use:   "attest --nonce HEX [--key FILE] [--statement DIGEST] [--out FILE] [--provider P]",
		Short: "Produce SEV-SNP or TDX evidence that binds a key, a nonce and a statement",
		Long: `Produce attestation evidence on this machine.

attest asks the AMD SEV-SNP secure processor or the Intel TDX module (through
configfs-tsm, else /dev/sev-guest or /dev/tdx_guest) for a report whose 64-byte
report data is SHA-512 over a domain-separated, length-prefixed encoding of the
public key, the verifier's nonce and the statement digest (the exact bytes are
in the pkg/evidence documentation). It writes a versioned JSON evidence bundle:
the platform, the raw report with its certificate table (SEV-SNP) or the quote
with its PCK chain (TDX), and the bound key, nonce and statement.

Without --key a new Ed25519 key is generated; its private half is written to
--key-out with mode 0600 (an existing file is never overwritten).

On a machine without SEV-SNP or TDX attest says what it probed. For
development, --provider software writes a bundle without hardware evidence,
labelled unattested; it never verifies as hardware.

Check evidence with 'cmcp attest verify'.`,
		Example: `  cmcp attest --nonce $(openssl rand -hex 32) --key gateway.pub --out evidence.json
  cmcp attest --nonce 0011aabb --statement sha256:9f86d0... --provider software
  cmcp attest verify evidence.json --nonce 0011aabb --reference reference-values.json`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAttest(cmd, e, o)
		},
	}
	o.AddFlags(cmd.Flags())
	cmd.AddCommand(newAttestVerifyCmd(e))
	return cmd
}

func runAttest(cmd *cobra.Command, e *env, o *attestOptions) error {
	p := e.printer()
	nonce, err := o.Nonce.get()
	if err != nil {
		return err
	}
	if nonce == nil {
		return exitcode.Errorf(exitcode.ExitUsage, "a nonce is required: --nonce HEX or --nonce-file FILE").
			Hint("the verifier chooses the nonce, e.g. --nonce $(openssl rand -hex 32), and checks it with 'cmcp attest verify --nonce'")
	}
	stmt, err := parseStatement(o.Statement)
	if err != nil {
		return err
	}
	certs, err := readCertificates(o.Certs)
	if err != nil {
		return err
	}
	var pub ed25519.PublicKey
	if o.Key != "" {
		if pub, err = readPublicKey(o.Key); err != nil {
			return err
		}
	}
	prov, err := tee.Detect(tee.Options{Provider: o.Provider})
	if err != nil {
		var nh *tee.NoHardwareError
		if errors.As(err, &nh) {
			return exitcode.WithCode(exitcode.ExitIO, err)
		}
		return exitcode.WithCode(exitcode.ExitUsage, err)
	}
	if len(certs) > 0 {
		snp, ok := prov.(*tee.SNPProvider)
		if !ok {
			return exitcode.Errorf(exitcode.ExitUsage, "--cert applies to SEV-SNP only, the provider is %s", prov.Platform())
		}
		snp.ExtraCert = certs
	}
	keyFile := ""
	if pub == nil {
		var priv ed25519.PrivateKey
		pub, priv, err = ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		if err := writePrivateKey(o.KeyOut, priv); err != nil {
			return err
		}
		keyFile = o.KeyOut
	}
	// A key generated for evidence that was never written is useless, and
	// left behind it would make the retry fail ("never overwritten").
	dropKey := func() {
		if keyFile != "" {
			os.Remove(keyFile)
		}
	}
	b, err := prov.Attest(cmd.Context(), pub, nonce, stmt)
	if err != nil {
		dropKey()
		return exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("attest with %s via %s: %w", prov.Platform(), prov.Collector(), err))
	}
	if err := evidence.WriteFile(o.Out, b); err != nil {
		dropKey()
		return exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("write evidence: %w", err))
	}
	if !b.Attested {
		p.Warnf("wrote software evidence to %s: unattested, no hardware, development only", o.Out)
	}
	doc := attestDoc{SchemaVersion: ui.SchemaVersion, Out: o.Out, Platform: b.Platform, Attested: b.Attested,
		Collector: b.Collector, PublicKey: evidence.FormatPublicKey(pub), KeyFile: keyFile,
		Nonce: hex.EncodeToString(nonce), Statement: stmt.String(), ReportData: hex.EncodeToString(b.Binding.ReportData)}
	if p.JSONOut {
		return p.JSON(doc)
	}
	printAttest(p, doc)
	return nil
}

// printAttest says what attest wrote (doc) for people.
func printAttest(p *ui.Printer, doc attestDoc) {
	label := p.OK(doc.Platform)
	if !doc.Attested {
		label = p.Warn(doc.Platform + " (UNATTESTED, development only)")
	}
	p.Printf("%s evidence written to %s (via %s)\n", label, p.Bold(doc.Out), doc.Collector)
	p.Printf("  key:         %s\n", doc.PublicKey)
	if doc.KeyFile != "" {
		p.Printf("  private key: %s (generated, mode 0600)\n", doc.KeyFile)
	}
	p.Printf("  nonce:       %s\n", doc.Nonce)
	if doc.Statement != "" {
		p.Printf("  statement:   %s\n", doc.Statement)
	}
	p.Printf("  report data: %s\n", doc.ReportData)
}

// readCertificates reads the --cert files: the DER of every certificate
// they hold, in order.
func readCertificates(files []string) ([][]byte, error) {
	var certs [][]byte
	for _, f := range files {
		data, err := readInput(f)
		if err != nil {
			return nil, exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--cert: %w", err))
		}
		parsed, err := evidence.ParseCertificates(data)
		if err != nil {
			return nil, exitcode.Errorf(exitcode.ExitUsage, "--cert %s: %v", f, err)
		}
		for _, c := range parsed {
			certs = append(certs, c.Raw)
		}
	}
	return certs, nil
}

func writePrivateKey(path string, priv ed25519.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return exitcode.Errorf(exitcode.ExitIO, "--key-out %s exists: a private key is never overwritten", path).
				Hint("to bind the key it holds again, pass --key %s; for a new key, give another --key-out FILE", path)
		}
		return exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--key-out: %w", err))
	}
	if err := pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der}); err != nil {
		f.Close()
		os.Remove(path)
		return exitcode.WithCode(exitcode.ExitIO, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return exitcode.WithCode(exitcode.ExitIO, err)
	}
	return exitcode.WithCode(exitcode.ExitIO, f.Close())
}

type attestVerifyOptions struct {
	Nonce         nonceFlags
	Key           string
	Statement     string
	Reference     string
	Roots         string
	RawReport     string
	Certs         []string
	AllowSoftware bool
	At            string
}

func (o *attestVerifyOptions) AddFlags(fs *pflag.FlagSet) {
	o.Nonce.add(fs, "expected")
	fs.StringVar(&o.Key, "key", "", "expected bound public key: a FILE (PEM, ed25519:<base64>, hex or raw) or inline ed25519:<base64> or 64 hex digits")
	fs.StringVar(&o.Statement, "statement", "", "expected bound statement digest (sha256:<hex>)")
	fs.StringVar(&o.Reference, "reference", "", "reference values JSON (measurements, MRTD/RTMRs, host data, minimum TCB, policy)")
	fs.StringVar(&o.Roots, "roots", "", "PEM file of roots that replace the embedded AMD and Intel roots")
	fs.StringVar(&o.RawReport, "raw-report", "", "verify a raw SEV-SNP report or TDX quote v4 instead of a cmcp bundle")
	fs.StringArrayVar(&o.Certs, "cert", nil, "with --raw-report: the SEV-SNP VCEK or VLEK certificate, PEM or DER (repeatable)")
	fs.BoolVar(&o.AllowSoftware, "allow-software", false, "report software evidence as a warning instead of rejecting it (it is never affirming)")
	fs.StringVar(&o.At, "at", "", "verify certificate validity at this RFC 3339 time instead of now")
}

type verifyDoc struct {
	SchemaVersion int    `json:"schema_version"`
	File          string `json:"file"`
	*evidence.Result
}

func newAttestVerifyCmd(e *env) *cobra.Command {
	o := &attestVerifyOptions{}
	cmd := &cobra.Command{
		Use:   "verify FILE | --raw-report FILE [--cert FILE]...",
		Short: "Verify attestation evidence offline against pinned roots and reference values",
		Long: `Verify attestation evidence offline.

verify checks a cmcp evidence bundle (or, with --raw-report, a raw SEV-SNP
report of version 2 to 5 with its VCEK or VLEK certificate, or a raw TDX quote
version 4 with its embedded PCK chain) without any network access:

  evidence     the report signature and the certificate chain up to the AMD ARK
               (Milan, Genoa, Turin; VCEK and VLEK) or the Intel SGX Root CA
               embedded in cmcp, or the roots in --roots (then the claim names
               the root from that file, not the vendor's); never a root carried
               by the evidence. A TDX quote must come from Intel's TD quoting
               enclave (its MRSIGNER, product ID 2, not a debug enclave, Intel's
               QE vendor ID: pinned, as collateral would give them).
               Revocation is not checked: there is no CRL offline, so a revoked
               VCEK, VLEK or PCK certificate is not noticed
  binding      the report data is the binding of the bundle's key, nonce and
               statement, and those are the --key and --statement expected
  freshness    the bound nonce is the --nonce expected
  debug        a debug-enabled guest is always rejected
  policy       SEV-SNP guest policy, VMPL, guest SVN; TDX attributes, XFAM
               and MRSEAM
  measurement  launch measurement, or MRTD and RTMRs, against --reference;
               a TDX measurement is affirming only with MRTD and all four
               RTMRs pinned
  host-data    SEV-SNP HOST_DATA or TDX MRCONFIGID against --reference
  tcb          minimum TCB from --reference; TDX TCB status needs Intel
               collateral and is always a warning offline

Each check is affirming, warning or contraindicated; the worst is the verdict.
A value absent from --reference leaves its check a warning naming what was
not compared (a minimum_guest_svn of 0 compares nothing).
Raw evidence carries no cmcp binding: binding is reported as not applicable.
Software evidence is rejected (--allow-software: a warning). In --output json,
"attested" is true only for SEV-SNP or TDX evidence that verified (verdict
affirming or warning). Exit codes: 0
affirming or warning, 20 bad evidence, 21 reference value or policy mismatch,
22 binding mismatch (key, nonce or statement), 2 usage, 3 I/O.`,
		Example: `  cmcp attest verify evidence.json --nonce 0011aabb --key gateway.pub --reference ref.json
  cmcp attest verify --raw-report report.bin --cert vcek.der
  cmcp attest verify --raw-report quote.dat --output json`,
		Args: usageArgs(func(cmd *cobra.Command, args []string) error {
			switch {
			case o.RawReport != "" && len(args) > 0:
				return fmt.Errorf("give a bundle FILE or --raw-report FILE, not both")
			case o.RawReport == "" && len(args) != 1:
				return fmt.Errorf("want one evidence bundle FILE (or --raw-report FILE)")
			case o.RawReport == "" && len(o.Certs) > 0:
				return fmt.Errorf("--cert goes with --raw-report (a bundle carries its certificates)")
			}
			return nil
		}),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAttestVerify(e, o, args)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runAttestVerify(e *env, o *attestVerifyOptions, args []string) error {
	p := e.printer()
	opts, err := o.verifyOptions()
	if err != nil {
		return err
	}
	var res *evidence.Result
	file := o.RawReport
	if o.RawReport != "" {
		if opts.ExpectKey != nil || !opts.ExpectStatement.IsZero() || opts.ExpectNonce != nil {
			return exitcode.Errorf(exitcode.ExitUsage, "--key, --statement and --nonce check a cmcp binding: raw evidence has none")
		}
		raw, err := readInput(o.RawReport)
		if err != nil {
			return exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--raw-report: %w", err))
		}
		var certs [][]byte
		for _, f := range o.Certs {
			c, err := readInput(f)
			if err != nil {
				return exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--cert: %w", err))
			}
			certs = append(certs, c)
		}
		if res, err = evidence.VerifyRaw(raw, certs, opts); err != nil {
			return exitcode.WithCode(exitcode.ExitUsage, err)
		}
	} else {
		file = args[0]
		data, err := readInput(file)
		if err != nil {
			return exitcode.WithCode(exitcode.ExitIO, err)
		}
		b, err := evidence.Decode(data)
		if err != nil {
			e := exitcode.Errorf(exitcode.ExitEvidence, "%s: %v", file, err)
			if evidence.DetectRaw(data) != "" {
				e.Hint("this looks like a raw report or quote: use --raw-report %s", file)
			}
			return e
		}
		if res, err = evidence.Verify(b, opts); err != nil {
			return exitcode.WithCode(exitcode.ExitFailure, err)
		}
	}
	if p.JSONOut {
		if err := p.JSON(verifyDoc{SchemaVersion: ui.SchemaVersion, File: file, Result: res}); err != nil {
			return err
		}
	} else {
		printResult(p, file, res)
	}
	return attestVerifyErr(res)
}

// verifyOptions are the checks the flags ask of the evidence.
func (o *attestVerifyOptions) verifyOptions() (evidence.VerifyOptions, error) {
	var opts evidence.VerifyOptions
	var err error
	if opts.ExpectNonce, err = o.Nonce.get(); err != nil {
		return opts, err
	}
	if o.Key != "" {
		if opts.ExpectKey, err = readPublicKey(o.Key); err != nil {
			return opts, err
		}
	}
	if opts.ExpectStatement, err = parseStatement(o.Statement); err != nil {
		return opts, err
	}
	opts.AllowSoftware = o.AllowSoftware
	if o.At != "" {
		if opts.Now, err = time.Parse(time.RFC3339, o.At); err != nil {
			return opts, exitcode.Errorf(exitcode.ExitUsage, "--at: %v", err)
		}
	}
	if o.Reference != "" {
		if opts.Reference, err = evidence.ReadReferenceFile(o.Reference); err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return opts, exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--reference: %w", err))
			}
			return opts, exitcode.WithCode(exitcode.ExitUsage, fmt.Errorf("--reference: %w", err))
		}
	}
	if o.Roots != "" {
		data, err := readInput(o.Roots)
		if err != nil {
			return opts, exitcode.WithCode(exitcode.ExitIO, fmt.Errorf("--roots: %w", err))
		}
		if opts.Roots, err = evidence.ParseRoots(data, o.Roots); err != nil {
			return opts, exitcode.Errorf(exitcode.ExitUsage, "--roots %s: %v", o.Roots, err)
		}
	}
	return opts, nil
}

func attestVerifyErr(res *evidence.Result) error {
	err := res.Err()
	if err == nil {
		return nil
	}
	code := exitcode.ExitEvidence
	switch res.Failure() {
	case evidence.FailBinding:
		code = exitcode.ExitBinding
	case evidence.FailRefValue:
		code = exitcode.ExitRefValue
	}
	ue := exitcode.WithCode(code, err).(*exitcode.Error)
	if c := res.Claim(evidence.ClaimEvidence); c != nil && c.Status == evidence.StatusContraindicated && res.Platform == evidence.PlatformSoftware {
		ue.Hint("software evidence is unattested; --allow-software reports it as a warning for development")
	}
	return ue
}

func printResult(p *ui.Printer, file string, r *evidence.Result) {
	platform := r.Platform
	if platform == "" {
		platform = "unknown"
	}
	if !r.Attested && r.Platform == evidence.PlatformSoftware {
		platform = p.Warn("software (UNATTESTED, development only)")
	}
	p.Printf("%s: %s evidence, roots: %s\n", p.Bold(file), platform, r.Roots)
	width := 0
	for _, c := range r.Claims {
		width = max(width, len(c.Name))
	}
	for _, c := range r.Claims {
		var mark string
		switch c.Status {
		case evidence.StatusAffirming:
			mark = p.OK("✔")
		case evidence.StatusWarning:
			mark = p.Warn("!")
		case evidence.StatusContraindicated:
			mark = p.Bad("✗")
		default:
			mark = p.Dim("-")
		}
		p.Printf("  %s %-*s  %s\n", mark, width, c.Name, c.Reason)
	}
	if len(r.Report) > 0 {
		keys := make([]string, 0, len(r.Report))
		for k := range r.Report {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		p.Printf("  %s\n", p.Dim("report:"))
		for _, k := range keys {
			p.Printf("    %s\n", p.Dim(fmt.Sprintf("%-14s %s", k, r.Report[k])))
		}
	}
	verdict := string(r.Verdict)
	switch r.Verdict {
	case evidence.StatusAffirming:
		verdict = p.OK(strings.ToUpper(verdict))
	case evidence.StatusWarning:
		verdict = p.Warn(strings.ToUpper(verdict))
	case evidence.StatusContraindicated:
		verdict = p.Bad(strings.ToUpper(verdict))
	}
	p.Printf("verdict: %s (binding: %s)\n", verdict, r.Binding)
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}
