package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

func TestSpawnDigestTools(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sample-server")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/sample-server").CombinedOutput(); err != nil {
		t.Fatalf("build the sample server: %v\n%s", err, out)
	}
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"spawn-digest", "--tools", "--name", "files", "--", bin}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"catalog:\n  upstreams:\n    \"files\":\n      tools:\n", "        \"echo\": sha256:", "        \"read_file\": sha256:"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}

	stdout.Reset()
	if code := Main([]string{"--output", "json", "spawn-digest", "--tools", "--", bin}, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("json: exit %d: %s", code, stderr.String())
	}
	var doc struct {
		Tools []struct{ Name, Pin string }
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Tools) != 4 || !strings.HasPrefix(doc.Tools[0].Pin, "sha256:") {
		t.Fatalf("tools: %+v", doc.Tools)
	}

	// A program that is not an MCP server.
	stderr.Reset()
	code := Main([]string{"spawn-digest", "--tools", "--", "true"}, strings.NewReader(""), &stdout, &stderr)
	if code != exitcode.ExitRuntime || !strings.Contains(stderr.String(), "list the tools of") || !strings.Contains(stderr.String(), "cmcp: hint:") {
		t.Fatalf("non-MCP program: exit %d: %s", code, stderr.String())
	}

	// A server that fails at start: what it wrote to stderr is shown.
	fails := filepath.Join(t.TempDir(), "fails.sh")
	if err := os.WriteFile(fails, []byte("#!/bin/sh\necho 'FATAL: missing API_KEY' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	code = Main([]string{"spawn-digest", "--tools", "--", fails}, strings.NewReader(""), &stdout, &stderr)
	if code != exitcode.ExitRuntime || !strings.Contains(stderr.String(), "FATAL: missing API_KEY") {
		t.Fatalf("a server failing at start: exit %d, its stderr not shown: %s", code, stderr.String())
	}
}

// toolServer writes a "#!/bin/sh" MCP server that answers the handshake
// and lists tools with the given names.
func toolServer(t *testing.T, names ...string) string {
	t.Helper()
	var tools []string
	for _, n := range names {
		tools = append(tools, `{"name":"`+n+`","inputSchema":{"type":"object"}}`)
	}
	idOf := `id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')`
	body := "#!/bin/sh\nread -r line\n" + idOf + "\n" +
		`printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"` + upstream.ProtocolVersion + `","capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}}\n' "$id"` + "\n" +
		"read -r line\nread -r line\n" + idOf + "\n" +
		`printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[` + strings.Join(tools, ",") + `]}}\n' "$id"` + "\n" +
		"cat >/dev/null\n"
	p := filepath.Join(t.TempDir(), "srv")
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSpawnDigestToolsRefusesBadExposedNames: --tools pins only what the
// gateway will expose. A tool whose exposed name (NAME__tool, NAME being
// --name) is not 1-64 characters of [A-Za-z0-9_-] is printed as refused,
// with the reason, and gets no pin; the length limit depends on --name.
func TestSpawnDigestToolsRefusesBadExposedNames(t *testing.T) {
	long := strings.Repeat("a", 61)   // x__ + 61 = 64 characters; files__ + 61 = 68
	longer := strings.Repeat("a", 62) // x__ + 62 = 65 characters: one too many
	srv := toolServer(t, "ok", "read.file", long, longer)
	for _, c := range []struct {
		name    string
		refused []string
	}{
		{"x", []string{longer, "read.file"}},
		{"files", []string{long, longer, "read.file"}}, // sorted by name
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "--output", "json", "spawn-digest", "--tools", "--name", c.name, "--", srv)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var doc struct {
				Tools []struct{ Name, Pin, Error string }
			}
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatal(err)
			}
			var refused []string
			for _, tp := range doc.Tools {
				switch {
				case tp.Error != "" && tp.Pin == "":
					if !strings.Contains(tp.Error, "would be exposed as") {
						t.Errorf("tool %q refused for %q, want the exposed-name reason", tp.Name, tp.Error)
					}
					refused = append(refused, tp.Name)
				case tp.Error == "" && tp.Pin != "":
				default:
					t.Errorf("tool %+v", tp)
				}
			}
			if !slices.Equal(refused, c.refused) || len(doc.Tools) != 4 {
				t.Fatalf("refused %q of %+v, want %q refused", refused, doc.Tools, c.refused)
			}
			code, out, _ = runCLI(t, "spawn-digest", "--tools", "--name", c.name, "--", srv)
			// A refused tool is a comment only: no key line, not even one
			// without a pin.
			if code != 0 || !strings.Contains(out, "# read.file: refused by the gateway: ") || strings.Contains(out, `"read.file":`) {
				t.Fatalf("exit %d, text output:\n%s", code, out)
			}
		})
	}
}

// TestSpawnDigestToolsNoneAcceptedLoads: a server without tools, or one
// whose every tool the gateway would refuse, gets "tools: {}" (every tool
// refused), not "tools:" with nothing after it, which config.Load refuses;
// the refused tools stay listed beneath as comments. What is printed,
// pasted under upstreams: as it says, loads.
func TestSpawnDigestToolsNoneAcceptedLoads(t *testing.T) {
	for _, c := range []struct {
		name    string
		tools   []string
		comment string
	}{
		{"no tools", nil, ""},
		{"every tool refused", []string{"read.file"}, "# read.file: refused by the gateway: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := toolServer(t, c.tools...)
			code, out, errOut := runCLI(t, "spawn-digest", "--tools", "--name", "files", "--", srv)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if !strings.Contains(out, "      tools: {}") || !strings.Contains(out, c.comment) {
				t.Fatalf("output lacks tools: {} (and %q):\n%s", c.comment, out)
			}
			entry, cat, ok := strings.Cut(out, "catalog:\n")
			if !ok {
				t.Fatalf("no catalog section:\n%s", out)
			}
			p := filepath.Join(t.TempDir(), "cmcp.yaml")
			if err := os.WriteFile(p, []byte("version: 1\nserver: {tee: software}\naudit: {dir: audit}\nupstreams:\n"+entry+"catalog:\n"+cat), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Load(p)
			if err != nil {
				t.Fatalf("the printed output does not load: %v\n%s", err, out)
			}
			if pins := cfg.ToolPins("files"); pins == nil || len(pins) != 0 {
				t.Fatalf("loads as pins %v, want none accepted (tools: {})", pins)
			}
			code, out, _ = runCLI(t, "--output", "json", "spawn-digest", "--tools", "--name", "files", "--", srv)
			var doc struct {
				ToolsFlow string `json:"tools_flow"`
				ToolsYAML string `json:"tools_yaml"`
			}
			if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc.ToolsFlow != "{}" || !strings.Contains(doc.ToolsYAML, "tools: {}") {
				t.Fatalf("json: exit %d, %v: %s", code, err, out)
			}
		})
	}
}

// TestSpawnDigestToolsNamespaceFalse: with namespace: false (a single
// upstream) the gateway exposes tools by their own names, so a tool name
// too long for NAME__tool is accepted there. --namespace=false checks the
// names as that gateway would, pins such a tool and prints namespace:
// false in the entry; the output loads with the pin. Without the flag
// the refusal says that --namespace=false exists, when namespacing is
// what makes the name too long (and only then).
func TestSpawnDigestToolsNamespaceFalse(t *testing.T) {
	long := strings.Repeat("t", 60) // files__ + 60 = 67 characters
	srv := toolServer(t, long, "read.file")

	code, out, errOut := runCLI(t, "spawn-digest", "--tools", "--name", "files", "--", srv)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.Contains(l, "# "+long+": refused"):
			if !strings.Contains(l, "--namespace=false") {
				t.Errorf("the refusal of %s does not say --namespace=false exists:\n%s", long, l)
			}
		case strings.Contains(l, "# read.file: refused"):
			if strings.Contains(l, "--namespace") {
				t.Errorf("read.file is refused however it is exposed, yet the refusal names --namespace:\n%s", l)
			}
		}
	}

	code, out, errOut = runCLI(t, "spawn-digest", "--tools", "--namespace=false", "--name", "files", "--", srv)
	if code != 0 {
		t.Fatalf("--namespace=false: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "    namespace: false") || !strings.Contains(out, `"`+long+`": sha256:`) || !strings.Contains(out, "# read.file: refused by the gateway: ") {
		t.Fatalf("--namespace=false output:\n%s", out)
	}
	entry, cat, _ := strings.Cut(out, "catalog:\n")
	p := filepath.Join(t.TempDir(), "cmcp.yaml")
	if err := os.WriteFile(p, []byte("version: 1\nserver: {tee: software}\naudit: {dir: audit}\nupstreams:\n"+entry+"catalog:\n"+cat), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatalf("the printed output does not load: %v\n%s", err, out)
	}
	if u := cfg.Upstreams[0]; u.Namespaced() || len(cfg.ToolPins("files")) != 1 || cfg.ToolPins("files")[long].IsZero() {
		t.Fatalf("loads as namespaced %v, pins %v\n%s", u.Namespaced(), cfg.ToolPins("files"), out)
	}

	code, out, _ = runCLI(t, "--output", "json", "spawn-digest", "--tools", "--namespace=false", "--name", "files", "--", srv)
	var doc struct {
		Upstream config.Upstream `json:"upstream"`
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc.Upstream.Namespaced() {
		t.Fatalf("json: exit %d, %v, upstream %+v", code, err, doc.Upstream)
	}

	if code, _, errOut := runCLI(t, "spawn-digest", "--namespace=false", "--check", p); code != exitcode.ExitUsage {
		t.Fatalf("--namespace with --check: exit %d: %s", code, errOut)
	}
}
