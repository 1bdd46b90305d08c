package cli

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

// docsDate is the date printed in the man pages. It is fixed so that the
// generated files are reproducible; change it when cutting a release.
var docsDate = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// generateDocs renders the man pages (man/*.1) and shell completions
// (completions/cmcp.{bash,zsh,fish}) from the command tree. Keys are paths
// relative to the repository root. TestDocs compares them with the
// committed files, and writes them with CMCP_UPDATE_DOCS=1.
func generateDocs() (map[string][]byte, error) {
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	root := newRootCmd(e)
	root.InitDefaultCompletionCmd()
	root.InitDefaultHelpCmd()
	root.Long = strings.Replace(root.Long, exitCodesText(), "The exit codes of every command are listed under EXIT STATUS.", 1)

	out := map[string][]byte{}
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		if !c.IsAvailableCommand() && c != root || c.IsAdditionalHelpTopicCommand() {
			return nil
		}
		keepPlaceholders(c)
		hdr := &doc.GenManHeader{Section: "1", Source: "cmcp", Manual: "cmcp manual", Date: &docsDate}
		var b bytes.Buffer
		if err := doc.GenMan(c, hdr, &b); err != nil {
			return err
		}
		name := strings.ReplaceAll(c.CommandPath(), " ", "-") + ".1"
		out[filepath.Join("man", name)] = withExitStatus(b.Bytes())
		for _, sub := range c.Commands() {
			if err := walk(sub); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}

	var bash, zsh, fish bytes.Buffer
	if err := root.GenBashCompletionV2(&bash, true); err != nil {
		return nil, err
	}
	if err := root.GenZshCompletion(&zsh); err != nil {
		return nil, err
	}
	if err := root.GenFishCompletion(&fish, true); err != nil {
		return nil, err
	}
	out[filepath.Join("completions", "cmcp.bash")] = bash.Bytes()
	out[filepath.Join("completions", "_cmcp")] = zsh.Bytes()
	out[filepath.Join("completions", "cmcp.fish")] = fish.Bytes()
	return out, nil
}

// keepPlaceholders escapes the angle brackets of placeholders such as
// <upstream>__<tool> or sha256:<hex> in c's text and flag usages: the man
// pages are rendered from Markdown, which drops them as HTML tags (the page
// said "exposes their tools as __,"). The commands' own help is unchanged:
// this runs on the tree generateDocs builds for itself.
func keepPlaceholders(c *cobra.Command) {
	esc := func(s string) string { return placeholder.ReplaceAllString(s, `\<$1\>`) }
	c.Short, c.Long = esc(c.Short), esc(c.Long)
	c.LocalFlags().VisitAll(func(f *pflag.Flag) { f.Usage = esc(f.Usage) })
	c.InheritedFlags().VisitAll(func(f *pflag.Flag) { f.Usage = esc(f.Usage) })
}

// placeholder is a word in angle brackets: <upstream>, <hex>.
var placeholder = regexp.MustCompile(`<([A-Za-z][A-Za-z0-9_-]*)>`)

// withExitStatus inserts an EXIT STATUS section (from exitcode.ExitCodes) before
// SEE ALSO, or at the end.
func withExitStatus(page []byte) []byte {
	var s bytes.Buffer
	s.WriteString(".SH EXIT STATUS\n")
	for _, c := range exitcode.ExitCodes {
		fmt.Fprintf(&s, ".TP\n\\fB%d\\fP\n%s\n", c.Code, c.Meaning)
	}
	s.WriteString("\n")
	if i := bytes.Index(page, []byte(".SH SEE ALSO")); i >= 0 {
		return append(append(page[:i:i], s.Bytes()...), page[i:]...)
	}
	return append(page, s.Bytes()...)
}
