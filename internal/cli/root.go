// Package cli is cmcp's command layer: one cobra constructor per verb, each
// with an options struct, whose RunE validates and calls one library function.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/confidential-mcp/cmcp/internal/buildinfo"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/pid1"
	"github.com/confidential-mcp/cmcp/internal/ui"
)

// env is what every verb is given: the streams, the environment and the
// global output options. There is no package-level state.
type env struct {
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
	environ []string
	out     ui.Options
}

// printer returns the Printer for the current output options.
func (e *env) printer() *ui.Printer {
	return ui.NewPrinter(e.stdout, e.stderr, e.out, e.environ)
}

// Main runs cmcp with args and returns the process exit code. It prints every
// error exactly once, as "cmcp: error: ..." followed by "cmcp: hint: ..." lines.
// As process 1 (a container without an init) it first becomes cmcp's init
// and runs cmcp again as its child (package pid1).
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if code, done := pid1.Run(stderr); done {
		return code
	}
	return mainWithEnv(args, stdin, stdout, stderr, os.Environ())
}

// mainWithEnv is Main with an explicit environment (the testscript harness passes
// the script's).
func mainWithEnv(args []string, stdin io.Reader, stdout, stderr io.Writer, environ []string) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr, environ: environ}
	root := newRootCmd(e)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitcode.ExitOK
	}
	code := exitcode.CodeOf(err)
	var ue *exitcode.Error
	var coder exitcode.Coder
	if !errors.As(err, &ue) && !errors.As(err, &coder) && isCobraUsageError(err) {
		code = exitcode.ExitUsage
	}
	fmt.Fprintf(stderr, "cmcp: error: %s\n", ui.CleanLines(err.Error()))
	for _, h := range exitcode.HintsOf(err) {
		fmt.Fprintf(stderr, "cmcp: hint: %s\n", h)
	}
	if code == exitcode.ExitUsage && len(exitcode.HintsOf(err)) == 0 {
		fmt.Fprintf(stderr, "cmcp: hint: run '%s --help' for usage\n", commandPath(root, args))
	}
	return code
}

// isCobraUsageError recognises the errors cobra itself returns for an
// unknown command, flag or argument count.
func isCobraUsageError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "flag needs an argument", "invalid argument", "accepts ", "requires at least", "requires at most", "bad flag syntax", "if any flags in the group"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func commandPath(root *cobra.Command, args []string) string {
	c, _, err := root.Find(args)
	if err != nil || c == nil {
		return root.Name()
	}
	return c.CommandPath()
}

func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "cmcp",
		Short: "Confidential MCP gateway: attested, policy-checked, audited tool calls",
		Long: `cmcp is a confidential MCP gateway and the toolkit around it.

It is built to run inside a confidential VM (AMD SEV-SNP or Intel TDX), where
it binds its signing key to a hardware attestation report; elsewhere it uses
the "software" provider, whose evidence is labelled unattested. It decides
every tool call with a Cedar policy and writes every decision to a signed
Merkle-tree audit log that an auditor verifies offline. It spawns stdio MCP
servers itself and refuses to run code whose digest does not match its pin.` + "\n\n" + exitCodesText(),
		SilenceErrors:     true,
		SilenceUsage:      true,
		DisableAutoGenTag: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := e.out.Validate(); err != nil {
				return err
			}
			if err := rejectEmptyFlags(cmd); err != nil {
				return err
			}
			return rejectEmptyArgs(cmd, args)
		},
	}
	// cmcp --version prints what `cmcp version` prints (as text).
	root.Version = buildinfo.Get().Version
	root.Flags().Bool("version", false, "print the version, commit, build date and Go version (as 'cmcp version' does)")
	root.SetVersionTemplate(strings.NewReplacer("{{", "{{`{{`}}").Replace(versionText(buildinfo.Get(), func(s string) string { return s })))
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return exitcode.WithCode(exitcode.ExitUsage, err)
	})
	e.out.AddFlags(root.PersistentFlags())
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))
	root.AddCommand(
		newServeCmd(e),
		newConnectCmd(e),
		newVersionCmd(e),
		newSpawnDigestCmd(e),
		newAttestCmd(e),
		newVerifyChainCmd(e),
		newReplayCmd(e),
	)
	return root
}

func exitCodesText() string {
	var b strings.Builder
	b.WriteString("Exit codes:\n")
	for _, c := range exitcode.ExitCodes {
		fmt.Fprintf(&b, "  %2d  %s\n", c.Code, c.Meaning)
	}
	return strings.TrimRight(b.String(), "\n")
}

// usageArgs wraps a positional-argument validator so that its errors carry
// the usage exit code.
func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		return exitcode.WithCode(exitcode.ExitUsage, v(cmd, args))
	}
}
