package cli

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/measure"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// loadPasted pastes text under "upstreams:" of a minimal cmcp.yaml, as the
// output of spawn-digest says to, and loads it.
func loadPasted(t *testing.T, text string) (*config.Config, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cmcp.yaml")
	if err := os.WriteFile(p, []byte("version: 1\nserver: {tee: software}\naudit: {dir: audit}\nupstreams:\n"+text), 0o644); err != nil {
		t.Fatal(err)
	}
	return config.Load(p)
}

// TestSpawnDigestArgsRoundTrip: the entry spawn-digest prints loads back
// with exactly the arguments it measured, whatever they hold: "a,b" stays
// one argument, "c]" does not end the list.
func TestSpawnDigestArgsRoundTrip(t *testing.T) {
	for name, args := range map[string][]string{
		"comma":       {"a,b", "x"},
		"flag list":   {"--filter=a,b"},
		"bracket":     {"c]", "y"},
		"flow chars":  {"[", "]", "{", "}", "{a: b}", "[x, y]"},
		"quotes":      {`"`, `'`, `a"b'c`, `\`, `\n`},
		"comment":     {"#", "a #b", "a#b", " # x"},
		"indicators":  {"-", "-v", "*alias", "&anchor", "!tag", "!!str", "|", ">", "%", "@", "`", "?", ": ", "a: b", ":"},
		"typed":       {"true", "null", "~", "1", "0x10", "1e3", ".inf", "yes", "no", "2001-01-01"},
		"empty":       {"", "x", ""},
		"spaces":      {" lead", "trail ", "  "},
		"line breaks": {"a\nb", "a\r\nb", "a\u2028b", "a\u2029b", "a\u0085b", "\n"},
		"control":     {"a\tb", "a\x00b", "\x1b[31m", "\x7f", "a\ufeffb"},
		"unicode":     {"é", "日本", "🙂"},
	} {
		t.Run(name, func(t *testing.T) {
			r := &measure.Result{Command: "/bin/echo", Args: args, Resolved: "/bin/echo", CommandDigest: digest.FromSum([32]byte{1})}
			y := entryYAML(upstreamEntry("a", r), r)
			c, err := loadPasted(t, y)
			if err != nil {
				t.Fatalf("the printed entry does not load: %v\n%s", err, y)
			}
			if got := c.Upstreams[0].Stdio.Args; len(c.Upstreams) != 1 || !slices.Equal(got, args) {
				t.Fatalf("the printed entry loads as args %q, want %q\n%s", got, args, y)
			}
		})
	}
}
