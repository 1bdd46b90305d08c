package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/measure"
	"github.com/confidential-mcp/cmcp/internal/toolprobe"
	"github.com/confidential-mcp/cmcp/internal/ui"
)

type spawnDigestOptions struct {
	Tools  bool
	Target string
	Check  string
	Name   string
	// Namespace is the entry's namespace: setting. false (a single
	// upstream) exposes tools by their own names, which --tools checks.
	Namespace bool
}

func (o *spawnDigestOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Tools, "tools", false, "also spawn the measured server, list its tools and print their definition pins (catalog: section)")
	fs.StringVar(&o.Target, "target", "", "also measure this script (file digest) or package directory (tree digest)")
	fs.StringVar(&o.Check, "check", "", "re-measure every pinned stdio upstream of this cmcp.yaml and compare with its pins")
	fs.StringVar(&o.Name, "name", "", "upstream name in the printed cmcp.yaml entry (default: from the command)")
	fs.BoolVar(&o.Namespace, "namespace", true, "the entry's namespace: setting; --namespace=false (only for a single upstream) prints namespace: false and has --tools check tool names as exposed unprefixed, not as NAME__tool")
}

func newSpawnDigestCmd(e *env) *cobra.Command {
	o := &spawnDigestOptions{}
	cmd := &cobra.Command{
		Use:   "spawn-digest [--target FILE|DIR] [--name NAME] -- COMMAND [ARGS...] | --check CONFIG",
		Short: "Pin the code of a stdio MCP server, or check the pins of a config",
		Long: `Pin the code of a stdio MCP server before anyone is allowed to run it.

spawn-digest resolves COMMAND exactly as the gateway will (a name is looked up
in the absolute directories of PATH, then every symbolic link is resolved to the
real file), digests that file through its descriptor, and, with --target,
digests a script (file digest) or a whole package directory such as an
interpreted server's node_modules (tree digest; the encoding is documented in
pkg/digest/TREE.md). It prints the resolved path, the digests and a cmcp.yaml
upstream entry ready to paste under "upstreams:".

When COMMAND is a "#!" script, the interpreter it names is resolved as the
kernel would (the path after "#!", with one optional argument; for
"#!/usr/bin/env NAME", NAME looked up on PATH as the gateway will look it up
on the child's PATH) and pinned too (pin: interpreter:): the gateway checks
it at every spawn and executes that file itself, with the script as its
argument. An interpreter that is itself a "#!" script, or a "#!" line with
env options, is refused.

With --check CONFIG it re-measures every pinned stdio upstream of the config,
resolving each command with the PATH the gateway would give that child, and
prints a table: upstream, what was measured, pinned, actual and the result
(match, mismatch, missing, error, interpreter-unpinned for a "#!" script
whose pin has no interpreter digest). It exits 5 if any pin mismatches or any file
is missing, 3 if a file exists but cannot be measured, 0 if every pin matches.
Before measuring, it reads the files serve reads at start (server.tls cert,
key and client_ca, an HTTP upstream's ca_file, bearer_token_file and
headers_from_file) and exits 4, at the setting's line, if one is there but
unusable (a ca_file without a PEM certificate, an empty credential file).
A file that is missing or not readable here, and a credential variable
(bearer_token_env, headers_from_env) unset in its own environment, is a
warning, as secrets are often deployed only where serve runs: the pins
still decide the exit code. serve itself refuses to start without them.
Use it as the release gate in CI.

Large trees show progress on a terminal.`,
		Example: `  cmcp spawn-digest -- ls
  cmcp spawn-digest --tools --name files -- ./bin/sample-server --root /srv/data
  cmcp spawn-digest --tools --namespace=false --name files -- ./bin/sample-server
  cmcp spawn-digest --name files -- ./bin/sample-server --root /srv/data
  cmcp spawn-digest --target ./node_modules/@acme/server -- node ./node_modules/@acme/server/dist/index.js
  cmcp spawn-digest --output json -- ls | jq -r .command_digest
  cmcp spawn-digest --check cmcp.yaml`,
		Args: usageArgs(func(cmd *cobra.Command, args []string) error {
			switch {
			case o.Check != "" && len(args) > 0:
				return fmt.Errorf("give either --check CONFIG or a COMMAND, not both")
			case o.Check != "" && (o.Target != "" || o.Name != "" || cmd.Flags().Changed("namespace")):
				return fmt.Errorf("--target, --name and --namespace apply to a COMMAND, not to --check")
			case o.Check == "" && len(args) == 0:
				return fmt.Errorf("missing COMMAND: spawn-digest [--target FILE|DIR] -- COMMAND [ARGS...], or --check CONFIG")
			case len(args) > 0 && args[0] == "":
				return fmt.Errorf("empty COMMAND: spawn-digest [--target FILE|DIR] -- COMMAND [ARGS...] (is a shell variable unset?)")
			}
			return nil
		}),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := e.printer()
			if o.Check != "" {
				return runSpawnCheck(cmd.Context(), e, p, o.Check)
			}
			return runSpawnDigest(cmd.Context(), e, p, o, args)
		},
	}
	cmd.Flags().SetInterspersed(false)
	o.AddFlags(cmd.Flags())
	cmd.MarkFlagFilename("check", "yaml", "yml")
	cmd.MarkFlagFilename("target")
	cmd.ValidArgsFunction = func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return nil, cobra.ShellCompDirectiveDefault // COMMAND and its arguments: files
	}
	// The ARGS after COMMAND go to the server as they are, empty ones too.
	cmd.Annotations = map[string]string{annotationPassthroughArgs: "true"}
	return cmd
}

type spawnDigestDoc struct {
	SchemaVersion int `json:"schema_version"`
	*measure.Result
	Upstream  config.Upstream     `json:"upstream"`
	YAML      string              `json:"yaml"`
	Tools     []toolprobe.ToolPin `json:"tools,omitempty"`
	ToolsYAML string              `json:"tools_yaml,omitempty"`
	ToolsFlow string              `json:"tools_flow,omitempty"`
}

func runSpawnDigest(ctx context.Context, e *env, p *ui.Printer, o *spawnDigestOptions, args []string) error {
	name := o.Name
	if name == "" {
		name = measure.NameFromCommand(args[0])
	}
	if err := config.ValidateName(name); err != nil {
		return exitcode.Errorf(exitcode.ExitUsage, "--name: %w", err)
	}
	for i, a := range args {
		what := fmt.Sprintf("argument %d", i)
		if i == 0 {
			what = "COMMAND"
		}
		if err := measure.ValidUTF8(what, a); err != nil {
			return err
		}
	}
	prog := treeProgress(p)
	r, err := measure.Command(ctx, args[0], args[1:], e.getenv("PATH"), o.Target, prog.add)
	prog.done()
	if err != nil {
		return err
	}
	u := measure.Entry(name, r)
	if !o.Namespace {
		u.Namespace = &o.Namespace
	}
	for _, v := range [][2]string{{"the command", u.Stdio.Command}, {"the directory", u.Stdio.Dir}, {"--target", u.Pin.Target}} {
		if err := measure.ValidUTF8(v[0], v[1]); err != nil {
			return err
		}
	}
	y := measure.EntryYAML(u, r)
	doc := spawnDigestDoc{SchemaVersion: ui.SchemaVersion, Result: r, Upstream: u, YAML: y}
	if o.Tools {
		pins, err := toolPins(ctx, e, name, r, o.Namespace)
		if err != nil {
			return err
		}
		doc.Tools, doc.ToolsYAML, doc.ToolsFlow = pins, toolsYAML(name, pins), toolsFlow(pins)
	}
	if p.JSONOut {
		return p.JSON(doc)
	}
	// Everything printed is YAML (the facts are comments), so the whole
	// output can be appended under "upstreams:" in cmcp.yaml.
	// The facts are comments, and their values too are written through
	// measure.CommentText: a file name holding a line break must not end a
	// comment and start YAML of its own.
	p.Printf("%s %s\n", p.Dim("# command "), measure.CommentText(r.Command))
	p.Printf("%s %s (%s)\n", p.Dim("# resolved"), measure.CommentText(r.Resolved), measure.SizeText(r.CommandBytes))
	p.Printf("%s %s\n", p.Dim("# digest  "), p.Bold(r.CommandDigest.String()))
	if sc := r.Script; sc != nil {
		p.Printf("%s %s (%s; %s)\n", p.Dim("# interp  "), measure.CommentText(sc.Resolved), measure.ScriptText(sc), measure.SizeText(sc.Bytes))
		p.Printf("%s %s\n", p.Dim("# digest  "), p.Bold(sc.Digest.String()))
	}
	if t := r.Target; t != nil {
		p.Printf("%s %s (%s)\n", p.Dim("# target  "), measure.CommentText(t.Path), measure.TargetText(t))
		p.Printf("%s %s\n", p.Dim("# digest  "), p.Bold(t.Digest.String()))
	}
	p.Printf("%s\n%s", p.Dim("# cmcp.yaml entry: paste under upstreams:"), y)
	if o.Tools {
		p.Printf("\n%s\n%s", p.Dim("# cmcp.yaml: tool definition pins (merge into catalog:)"), doc.ToolsYAML)
	}
	return nil
}

// progressAdapter shows the progress of tree measurements on a terminal:
// one line per tree, with the files and bytes hashed so far.
type progressAdapter struct {
	p    *ui.Printer
	cur  *ui.Progress
	path string
}

func treeProgress(p *ui.Printer) *progressAdapter { return &progressAdapter{p: p} }

func (a *progressAdapter) add(path string, files, bytes int64) {
	if a.cur == nil || path != a.path {
		a.cur.Done()
		a.cur, a.path = a.p.Progress("measuring "+path+":", 0), path
	}
	a.cur.Status(fmt.Sprintf("%d files, %s", files, measure.SizeText(bytes)))
}

func (a *progressAdapter) done() { a.cur.Done() }

type spawnCheckDoc struct {
	SchemaVersion int           `json:"schema_version"`
	Config        string        `json:"config"`
	OK            bool          `json:"ok"`
	Results       []measure.Row `json:"results"`
	// Warnings are what serve would refuse at start that this machine
	// cannot check (a missing credential file, an unset variable).
	Warnings []string `json:"warnings"`
}

func runSpawnCheck(ctx context.Context, e *env, p *ui.Printer, path string) error {
	c, err := config.Load(path)
	if err != nil {
		return err
	}
	warnings, err := measure.Preflight(c, e.getenv)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		p.Warnf("%s", w)
	}
	prog := treeProgress(p)
	rows, err := measure.Check(ctx, c, e.environ, prog.add)
	prog.done()
	if err != nil {
		return exitcode.WithCode(exitcode.ExitFailure, err)
	}
	var failed []measure.Row
	total := 0
	for _, r := range rows {
		if r.Status == measure.StatusSkipped || r.Status == measure.StatusUnpinned {
			continue
		}
		total++
		if r.Failed() {
			failed = append(failed, r)
		}
	}
	if p.JSONOut {
		if err := p.JSON(spawnCheckDoc{SchemaVersion: ui.SchemaVersion, Config: c.Path, OK: len(failed) == 0, Results: rows, Warnings: warnings}); err != nil {
			return err
		}
	} else {
		table := make([][]string, 0, len(rows))
		for _, r := range rows {
			what := r.What
			if r.Kind != "" {
				what += " (" + r.Kind + ")"
			}
			table = append(table, []string{r.Upstream, what + "\n" + r.Path, r.Pinned.String(), r.Actual.String(), statusText(p, r)})
		}
		p.Table([]string{"upstream", "measured", "pinned", "actual", "result"}, table)
	}
	if len(failed) > 0 {
		return &measure.CheckError{Config: path, Failed: failed, Total: total}
	}
	var unpinned []string
	for _, r := range rows {
		if r.Status == measure.StatusUnpinned {
			unpinned = append(unpinned, r.Upstream)
		}
	}
	if total == 0 {
		// A release gate that checked nothing must not pass.
		return exitcode.Errorf(exitcode.ExitMismatch, "%s pins no stdio upstream: nothing was checked", path).
			Hint("pin each stdio upstream's command (cmcp spawn-digest -- COMMAND) instead of allow_unmeasured")
	}
	if !p.JSONOut {
		p.Printf("%s %d of %d pins match\n", p.OK("ok"), total, total)
		if len(unpinned) > 0 {
			p.Printf("warning: not pinned, so not checked (allow_unmeasured): %s\n", strings.Join(unpinned, ", "))
		}
	}
	return nil
}

func statusText(p *ui.Printer, r measure.Row) string {
	switch r.Status {
	case measure.StatusMatch:
		return p.OK(r.Status)
	case measure.StatusUnpinned, measure.StatusSkipped:
		return p.Dim(r.Status)
	}
	return p.Bad(r.Status)
}
