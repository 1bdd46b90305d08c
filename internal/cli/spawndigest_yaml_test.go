package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/measure"
	"github.com/confidential-mcp/cmcp/internal/toolprobe"
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
			y := measure.EntryYAML(measure.Entry("a", r), r)
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

// TestSpawnDigestRefusesArgumentsThatAreNotUTF8: cmcp.yaml cannot hold an
// argument that is not UTF-8, so spawn-digest refuses it (exit 2), the
// command's and every later argument's alike.
func TestSpawnDigestRefusesArgumentsThatAreNotUTF8(t *testing.T) {
	for _, args := range [][]string{{"sh\xff"}, {"sh", "\xff"}, {"sh", "-c", "x\xfe"}} {
		code, out, errOut := runCLI(t, append([]string{"spawn-digest", "--"}, args...)...)
		if code != 2 || !strings.Contains(errOut, "is not UTF-8") || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, \"is not UTF-8\"", args, code, out, errOut)
		}
	}
}

// hostile holds what a file name or a server's tool name may carry to
// break out of a YAML comment or value: line breaks of every kind, "#",
// ":", quotes, and a whole admin section after them.
var hostile = []string{
	"x\nadmin: {listen: \"127.0.0.1:9098\", token_sha256: \"sha256:b5c1fb2efc6d6b4674c2fdcc48ce01b43a3b7c03763c0c3355de0099ee0f8c73\"}\n#",
	"x\radmin: {listen: \"127.0.0.1:9098\"}\r#",
	"x\u2028admin: {listen: \"127.0.0.1:9098\"}\u2028#",
	"x\u0085admin: {listen: \"127.0.0.1:9098\"}\u0085#",
	"x\u2029y: 'z' \"q\" # c: d",
}

// TestSpawnDigestOutputCarriesNoYAML: everything spawn-digest prints,
// pasted under "upstreams:", loads back as exactly the entry it meant
// (the one --output json gives), whatever the command's path, its
// resolved path, its "#!" interpreter's path and the target's path hold;
// nothing written by a file name reaches the config as YAML of its own.
func TestSpawnDigestOutputCarriesNoYAML(t *testing.T) {
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	shBytes, err := os.ReadFile(sh)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hostile {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			dir := t.TempDir()
			// The interpreter's path goes on a "#!" line: no '\n' nor
			// space there, the rest as it is.
			interp := filepath.Join(dir, "sh"+strings.NewReplacer("\n", "\u2028", " ", "_").Replace(h))
			if err := os.WriteFile(interp, shBytes, 0o755); err != nil {
				t.Fatal(err)
			}
			real := filepath.Join(dir, "real"+h)
			if err := os.WriteFile(real, []byte("#!"+interp+"\nexit 0\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := filepath.Join(dir, "cmd"+h)
			if err := os.Symlink(real, cmd); err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(dir, "target"+h)
			if err := os.WriteFile(target, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			run := func(args ...string) string {
				var stdout, stderr bytes.Buffer
				if code := Main(args, strings.NewReader(""), &stdout, &stderr); code != 0 {
					t.Fatalf("%q: exit %d: %s", args, code, stderr.String())
				}
				return stdout.String()
			}
			text := run("spawn-digest", "--name", "s", "--target", target, "--", cmd, h)
			var doc struct {
				Upstream config.Upstream `json:"upstream"`
			}
			if err := json.Unmarshal([]byte(run("--output", "json", "spawn-digest", "--name", "s", "--target", target, "--", cmd, h)), &doc); err != nil {
				t.Fatal(err)
			}
			c, err := loadPasted(t, text)
			if err != nil {
				t.Fatalf("the printed output does not load: %v\n%s", err, text)
			}
			if c.Admin != nil || len(c.Upstreams) != 1 {
				t.Fatalf("the printed output loads as admin %+v and %d upstreams\n%s", c.Admin, len(c.Upstreams), text)
			}
			got, _ := json.Marshal(c.Upstreams[0])
			want, _ := json.Marshal(doc.Upstream)
			if !bytes.Equal(got, want) {
				t.Fatalf("the printed output loads as\n%s\nwant\n%s\n%s", got, want, text)
			}
		})
	}
}

// TestSpawnDigestToolsOutputCarriesNoYAML: the catalog section printed by
// --tools loads back as exactly the pins of the accepted tools, whatever
// the names of the tools, accepted or refused, and the reasons hold.
func TestSpawnDigestToolsOutputCarriesNoYAML(t *testing.T) {
	pin := digest.FromSum([32]byte{7})
	pins := []toolprobe.ToolPin{{Name: "ok", Pin: pin}, {Name: "a: b # c", Pin: pin}}
	for _, h := range hostile {
		pins = append(pins, toolprobe.ToolPin{Name: h, Error: "refused: " + h})
	}
	r := &measure.Result{Command: "/bin/echo", Resolved: "/bin/echo", CommandDigest: pin}
	text := measure.EntryYAML(measure.Entry("s", r), r) + toolsYAML("s", pins)
	// The catalog section is printed to be merged at the top level.
	entry, cat, _ := strings.Cut(text, "catalog:\n")
	p := filepath.Join(t.TempDir(), "cmcp.yaml")
	if err := os.WriteFile(p, []byte("version: 1\nserver: {tee: software}\naudit: {dir: audit}\nupstreams:\n"+entry+"catalog:\n"+cat), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(p)
	if err != nil {
		t.Fatalf("the printed output does not load: %v\n%s", err, text)
	}
	want := map[string]digest.Digest{"ok": pin, "a: b # c": pin}
	if c.Admin != nil || c.Catalog == nil || len(c.Catalog.Upstreams) != 1 || !maps.EqualFunc(c.Catalog.Upstreams["s"].Tools, want, digest.Digest.Equal) {
		t.Fatalf("the printed output loads as admin %+v, catalog %+v\n%s", c.Admin, c.Catalog, text)
	}
	flow := toolsFlow(pins)
	var m map[string]string
	if err := yaml.Unmarshal([]byte(flow), &m); err != nil || len(m) != 2 || m["ok"] != pin.String() || m["a: b # c"] != pin.String() {
		t.Fatalf("tools_flow %s loads as %q (%v)", flow, m, err)
	}
}
