package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

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
		name = nameFromCommand(args[0])
	}
	if err := config.ValidateName(name); err != nil {
		return exitcode.Errorf(exitcode.ExitUsage, "--name: %w", err)
	}
	for i, a := range args {
		what := fmt.Sprintf("argument %d", i)
		if i == 0 {
			what = "COMMAND"
		}
		if err := validUTF8(what, a); err != nil {
			return err
		}
	}
	prog := treeProgress(p)
	r, err := measure.Command(ctx, args[0], args[1:], e.getenv("PATH"), o.Target, prog.add)
	prog.done()
	if err != nil {
		return err
	}
	u := upstreamEntry(name, r)
	if !o.Namespace {
		u.Namespace = &o.Namespace
	}
	for _, v := range [][2]string{{"the command", u.Stdio.Command}, {"the directory", u.Stdio.Dir}, {"--target", u.Pin.Target}} {
		if err := validUTF8(v[0], v[1]); err != nil {
			return err
		}
	}
	y := entryYAML(u, r)
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
	// commentText: a file name holding a line break must not end a
	// comment and start YAML of its own.
	p.Printf("%s %s\n", p.Dim("# command "), commentText(r.Command))
	p.Printf("%s %s (%s)\n", p.Dim("# resolved"), commentText(r.Resolved), sizeText(r.CommandBytes))
	p.Printf("%s %s\n", p.Dim("# digest  "), p.Bold(r.CommandDigest.String()))
	if sc := r.Script; sc != nil {
		p.Printf("%s %s (%s; %s)\n", p.Dim("# interp  "), commentText(sc.Resolved), scriptText(sc), sizeText(sc.Bytes))
		p.Printf("%s %s\n", p.Dim("# digest  "), p.Bold(sc.Digest.String()))
	}
	if t := r.Target; t != nil {
		p.Printf("%s %s (%s)\n", p.Dim("# target  "), commentText(t.Path), targetText(t))
		p.Printf("%s %s\n", p.Dim("# digest  "), p.Bold(t.Digest.String()))
	}
	p.Printf("%s\n%s", p.Dim("# cmcp.yaml entry: paste under upstreams:"), y)
	if o.Tools {
		p.Printf("\n%s\n%s", p.Dim("# cmcp.yaml: tool definition pins (merge into catalog:)"), doc.ToolsYAML)
	}
	return nil
}

// upstreamEntry is the config entry that pins r.
func upstreamEntry(name string, r *measure.Result) config.Upstream {
	cmd := r.Command
	if strings.ContainsRune(cmd, '/') && !filepath.IsAbs(cmd) {
		// Relative paths in cmcp.yaml are relative to the file, not to
		// where spawn-digest ran: write it absolute.
		cmd, _ = filepath.Abs(cmd)
	}
	u := config.Upstream{Name: name, Stdio: &config.Stdio{Command: cmd, Args: r.Args}, Pin: &config.Pin{Command: r.CommandDigest}}
	if len(r.Args) == 0 {
		u.Stdio.Args = nil
	}
	if r.Target != nil {
		u.Pin.Target, u.Pin.TargetDigest = r.Target.Path, r.Target.Digest
	}
	if r.Script != nil {
		u.Pin.Interpreter = r.Script.Digest
	}
	if relativeFileArg(r.Args) {
		// A relative argument naming a file (node ./dist/index.js) would
		// resolve against the gateway's working directory, not where the
		// pins were taken: the target would be checked here and another
		// file run there. The child is started where spawn-digest ran.
		u.Stdio.Dir, _ = os.Getwd()
	}
	return u
}

// relativeFileArg reports whether an argument is a relative path to
// something that exists (from the current directory).
func relativeFileArg(args []string) bool {
	for _, a := range args {
		if a == "" || strings.HasPrefix(a, "-") || filepath.IsAbs(a) {
			continue
		}
		if _, err := os.Lstat(a); err == nil {
			return true
		}
	}
	return false
}

// entryYAML renders u as a list item to paste under "upstreams:", with
// comments saying what each digest covers. No value is written raw:
// strings are double-quoted (yamlQuote), values in comments go through
// commentText, and digests are cmcp's own text.
func entryYAML(u config.Upstream, r *measure.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - name: %s\n    stdio:\n      command: %s\n", yamlQuote(u.Name), yamlQuote(u.Stdio.Command))
	if len(u.Stdio.Args) > 0 {
		// Double-quoted, every one: a plain scalar in a flow list ends
		// at "," or "]" ("--filter=a,b" would load as two arguments).
		q := make([]string, len(u.Stdio.Args))
		for i, a := range u.Stdio.Args {
			q[i] = yamlQuote(a)
		}
		fmt.Fprintf(&b, "      args: [%s]\n", strings.Join(q, ", "))
	}
	if u.Stdio.Dir != "" {
		fmt.Fprintf(&b, "      dir: %s  # relative arguments resolve here, where the pins were taken\n", yamlQuote(u.Stdio.Dir))
	}
	fmt.Fprintf(&b, "    pin:\n      command: %s  # %s\n", u.Pin.Command, commentText(r.Resolved))
	if sc := r.Script; sc != nil {
		fmt.Fprintf(&b, "      interpreter: %s  # %s (%s)\n", sc.Digest, commentText(sc.Resolved), scriptText(sc))
	}
	if t := r.Target; t != nil {
		fmt.Fprintf(&b, "      target: %s\n      target_digest: %s  # %s\n", yamlQuote(t.Path), t.Digest, targetText(t))
	}
	if !u.Namespaced() {
		b.WriteString("    namespace: false  # tools exposed by their own names: only with a single upstream\n")
	}
	return b.String()
}

// yamlQuote writes s as a YAML double-quoted scalar on one line, in any
// context (block or flow): '"' and '\\' are escaped, and so is every
// character that is not printable, line breaks of every kind (\n, \r,
// U+0085, U+2028, U+2029) included. A byte that is not UTF-8 is written
// \xNN, which YAML reads as the character U+00NN: a value that must load
// back as written is checked to be UTF-8 first (validUTF8).
func yamlQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, "\\x%02x", s[0])
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString("\\n")
		case r == '\t':
			b.WriteString("\\t")
		case r == '\r':
			b.WriteString("\\r")
		case r == ' ' || unicode.IsPrint(r):
			b.WriteString(s[:n])
		case r <= 0xffff:
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			fmt.Fprintf(&b, "\\U%08x", r)
		}
		s = s[n:]
	}
	b.WriteByte('"')
	return b.String()
}

// commentText is s to write in a YAML comment: as it is when every
// character is printable, else quoted (yamlQuote), so that no line break
// of any kind (\n, \r, U+0085, U+2028, U+2029) ends the comment.
func commentText(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || (r != ' ' && !unicode.IsPrint(r)) {
			return yamlQuote(s)
		}
	}
	return s
}

// validUTF8 refuses a value that cmcp.yaml cannot hold: YAML text is
// Unicode, so bytes that are not UTF-8 would load back as other bytes.
func validUTF8(what, s string) error {
	if !utf8.ValidString(s) {
		return exitcode.Errorf(exitcode.ExitUsage, "%s %s is not UTF-8: cmcp.yaml cannot hold it", what, yamlQuote(s))
	}
	return nil
}

var nameBad = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// nameFromCommand derives an upstream name from a command.
func nameFromCommand(c string) string {
	n := nameBad.ReplaceAllString(filepath.Base(c), "-")
	for strings.Contains(n, "__") {
		n = strings.ReplaceAll(n, "__", "_")
	}
	n = strings.Trim(n, "-")
	if len(n) > config.MaxNameLen {
		n = n[:config.MaxNameLen]
	}
	if n == "" {
		n = "upstream"
	}
	return n
}

// scriptText says where a "#!" command's interpreter comes from.
func scriptText(sc *measure.Script) string {
	if sc.Env {
		return commentText("#!"+sc.Line) + ", found on PATH"
	}
	return commentText("#!" + sc.Line)
}

func targetText(t *measure.Target) string {
	if t.Kind == measure.KindTree {
		return fmt.Sprintf("tree: %d files, %s", t.Files, sizeText(t.Bytes))
	}
	return "file: " + sizeText(t.Bytes)
}

func sizeText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
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
	a.cur.Status(fmt.Sprintf("%d files, %s", files, sizeText(bytes)))
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
	// What serve would refuse at start that can be seen from here: a
	// file it reads (TLS, CA and credential files) that is there but
	// unusable is an error. One that is not there, or not readable here,
	// is a warning, as is a credential variable unset in this
	// environment: secrets are often deployed only where serve runs, and
	// the pins are what this gate checks.
	warnings := []string{}
	if err := c.CheckFiles(); err != nil {
		var all, bad config.Errors
		if !errors.As(err, &all) {
			return err
		}
		for _, fe := range all {
			if errors.Is(fe, fs.ErrNotExist) || errors.Is(fe, fs.ErrPermission) {
				warnings = append(warnings, fmt.Sprintf("%v; not checked here: cmcp serve refuses to start unless it can read it", fe))
				continue
			}
			bad = append(bad, fe)
		}
		if len(bad) > 0 {
			return bad
		}
	}
	var unset config.Errors
	if errors.As(c.CheckEnv(func(k string) (string, bool) { v := e.getenv(k); return v, v != "" }, "this environment; cmcp serve needs it in its own"), &unset) {
		for _, u := range unset {
			warnings = append(warnings, u.Error())
		}
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
