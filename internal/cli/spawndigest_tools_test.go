package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/ui"
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
	if code != ui.ExitRuntime || !strings.Contains(stderr.String(), "list the tools of") || !strings.Contains(stderr.String(), "cmcp: hint:") {
		t.Fatalf("non-MCP program: exit %d: %s", code, stderr.String())
	}

	// A server that fails at start: what it wrote to stderr is shown.
	fails := filepath.Join(t.TempDir(), "fails.sh")
	if err := os.WriteFile(fails, []byte("#!/bin/sh\necho 'FATAL: missing API_KEY' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	code = Main([]string{"spawn-digest", "--tools", "--", fails}, strings.NewReader(""), &stdout, &stderr)
	if code != ui.ExitRuntime || !strings.Contains(stderr.String(), "FATAL: missing API_KEY") {
		t.Fatalf("a server failing at start: exit %d, its stderr not shown: %s", code, stderr.String())
	}
}
