package measure

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

// The cmcp.yaml entry that spawn-digest prints for a measured command: a
// list item to paste under "upstreams:", its values quoted so that it
// loads back as exactly what was measured.

// Entry is the config entry that pins r.
func Entry(name string, r *Result) config.Upstream {
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

// EntryYAML renders u as a list item to paste under "upstreams:", with
// comments saying what each digest covers. No value is written raw:
// strings are double-quoted (YAMLQuote), values in comments go through
// CommentText, and digests are cmcp's own text.
func EntryYAML(u config.Upstream, r *Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - name: %s\n    stdio:\n      command: %s\n", YAMLQuote(u.Name), YAMLQuote(u.Stdio.Command))
	if len(u.Stdio.Args) > 0 {
		// Double-quoted, every one: a plain scalar in a flow list ends
		// at "," or "]" ("--filter=a,b" would load as two arguments).
		q := make([]string, len(u.Stdio.Args))
		for i, a := range u.Stdio.Args {
			q[i] = YAMLQuote(a)
		}
		fmt.Fprintf(&b, "      args: [%s]\n", strings.Join(q, ", "))
	}
	if u.Stdio.Dir != "" {
		fmt.Fprintf(&b, "      dir: %s  # relative arguments resolve here, where the pins were taken\n", YAMLQuote(u.Stdio.Dir))
	}
	fmt.Fprintf(&b, "    pin:\n      command: %s  # %s\n", u.Pin.Command, CommentText(r.Resolved))
	if sc := r.Script; sc != nil {
		fmt.Fprintf(&b, "      interpreter: %s  # %s (%s)\n", sc.Digest, CommentText(sc.Resolved), ScriptText(sc))
	}
	if t := r.Target; t != nil {
		fmt.Fprintf(&b, "      target: %s\n      target_digest: %s  # %s\n", YAMLQuote(t.Path), t.Digest, TargetText(t))
	}
	if !u.Namespaced() {
		b.WriteString("    namespace: false  # tools exposed by their own names: only with a single upstream\n")
	}
	return b.String()
}

// YAMLQuote writes s as a YAML double-quoted scalar on one line, in any
// context (block or flow): '"' and '\\' are escaped, and so is every
// character that is not printable, line breaks of every kind (\n, \r,
// U+0085, U+2028, U+2029) included. A byte that is not UTF-8 is written
// \xNN, which YAML reads as the character U+00NN: a value that must load
// back as written is checked to be UTF-8 first (ValidUTF8).
func YAMLQuote(s string) string {
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

// CommentText is s to write in a YAML comment: as it is when every
// character is printable, else quoted (YAMLQuote), so that no line break
// of any kind (\n, \r, U+0085, U+2028, U+2029) ends the comment.
func CommentText(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || (r != ' ' && !unicode.IsPrint(r)) {
			return YAMLQuote(s)
		}
	}
	return s
}

// ValidUTF8 refuses a value that cmcp.yaml cannot hold: YAML text is
// Unicode, so bytes that are not UTF-8 would load back as other bytes.
func ValidUTF8(what, s string) error {
	if !utf8.ValidString(s) {
		return exitcode.Errorf(exitcode.ExitUsage, "%s %s is not UTF-8: cmcp.yaml cannot hold it", what, YAMLQuote(s))
	}
	return nil
}

var nameBad = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// NameFromCommand derives an upstream name from a command.
func NameFromCommand(c string) string {
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

// ScriptText says where a "#!" command's interpreter comes from.
func ScriptText(sc *Script) string {
	if sc.Env {
		return CommentText("#!"+sc.Line) + ", found on PATH"
	}
	return CommentText("#!" + sc.Line)
}

// TargetText says what a measure target is: a file, or a tree, and its size.
func TargetText(t *Target) string {
	if t.Kind == KindTree {
		return fmt.Sprintf("tree: %d files, %s", t.Files, SizeText(t.Bytes))
	}
	return "file: " + SizeText(t.Bytes)
}

// SizeText is n bytes for people (KiB, MiB, GiB).
func SizeText(n int64) string {
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
