package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/measure"
)

// pyServer writes a fresh Python package tree (no __pycache__) whose
// server.py imports helper.py, so that Python writes helper's bytecode
// into pkg/__pycache__ on its first run, and returns the tree.
func pyServer(t *testing.T) string {
	t.Helper()
	// The real interpreter, not a wrapper script on PATH (pyenv's shim).
	out, err := exec.Command("python3", "-c", "import os, sys; print(os.path.realpath(sys.executable))").Output()
	python := strings.TrimSpace(string(out))
	if err != nil || python == "" {
		t.Skipf("no python3: %v", err)
	}
	pkg := filepath.Join(t.TempDir(), "pkg")
	if err := os.Mkdir(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	server := "#!" + python + `
import sys, json, os
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import helper
for line in sys.stdin:
    m = json.loads(line)
    if 'id' not in m: continue
    if m['method'] == 'initialize':
        r = {"protocolVersion": m['params']['protocolVersion'], "capabilities": {"tools": {}}, "serverInfo": {"name": "py", "version": "1"}}
    elif m['method'] == 'tools/list':
        r = {"tools": [{"name": "hello", "inputSchema": {"type": "object"}}]}
    else:
        r = {"content": [{"type": "text", "text": helper.greet()}]}
    print(json.dumps({"jsonrpc": "2.0", "id": m['id'], "result": r}), flush=True)
`
	if err := os.WriteFile(filepath.Join(pkg, "server.py"), []byte(server), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pkg, "helper.py"), []byte("def greet():\n    return 'hi'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return pkg
}

// pycacheAdvice is what the operator must be told when a Python server
// wrote its bytecode into its measured --target tree.
var pycacheAdvice = []string{"wrote into its --target tree", "__pycache__", "PYTHONDONTWRITEBYTECODE=1", "after a first run"}

// TestSpawnDigestSaysThePythonServerWroteIntoItsTarget: a Python server
// on a fresh tree writes __pycache__ into its --target tree, so the first
// spawn-digest --tools is refused. The error says so (the server wrote
// into its --target tree, and what to do: pin it after a first run, or
// PYTHONDONTWRITEBYTECODE=1 in the upstream's env), not "retry once the
// files are no longer being changed" with a hint that the server must
// speak MCP on stdin/stdout; run again, it pins the tree with its cache.
func TestSpawnDigestSaysThePythonServerWroteIntoItsTarget(t *testing.T) {
	pkg := pyServer(t)
	server := filepath.Join(pkg, "server.py")
	code, _, errOut := runCLI(t, "spawn-digest", "--name", "py", "--target", pkg, "--tools", "--", server)
	if code == 0 {
		t.Fatalf("a tree written by the server during --tools was pinned:\n%s", errOut)
	}
	for _, want := range append([]string{"wrote Python bytecode", "--target"}, pycacheAdvice...) {
		if !strings.Contains(errOut, want) {
			t.Errorf("the error does not say %q:\n%s", want, errOut)
		}
	}
	for _, not := range []string{"stdin/stdout", "no longer being changed"} {
		if strings.Contains(errOut, not) {
			t.Errorf("the error says %q, which is not the cause:\n%s", not, errOut)
		}
	}
	if code, out, errOut := runCLI(t, "spawn-digest", "--name", "py", "--target", pkg, "--tools", "--", server); code != 0 || !strings.Contains(out, `"hello": sha256:`) {
		t.Fatalf("the second run, after the cache was written: exit %d\n%s%s", code, out, errOut)
	}
}

// TestServeSaysThePythonServerWroteIntoItsTarget: cmcp serve refusing
// the same spawn (the tree pinned before any run) logs the same advice.
func TestServeSaysThePythonServerWroteIntoItsTarget(t *testing.T) {
	pkg := pyServer(t)
	server := filepath.Join(pkg, "server.py")
	// Pinned before any run: measure does not run the server.
	r, err := measure.Command(context.Background(), server, nil, os.Getenv("PATH"), pkg, nil)
	if err != nil || r.Script == nil || r.Target == nil {
		t.Fatalf("measure: %v", err)
	}
	cmdPin, interpPin, treePin := r.CommandDigest, r.Script.Digest, r.Target.Digest
	tmp := t.TempDir()
	cfgPath := filepath.Join(tmp, "cmcp.yaml")
	cfg := "version: 1\nserver: {tee: software}\naudit: {dir: audit}\nupstreams:\n  - name: py\n    stdio: {command: " + server + "}\n    lifecycle: shared\n" +
		"    pin:\n      command: " + cmdPin.String() + "\n      interpreter: " + interpPin.String() + "\n      target: " + pkg + "\n      target_digest: " + treePin.String() + "\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gw := exec.CommandContext(ctx, os.Args[0], "serve", "--stdio", "-c", cfgPath)
	gw.Env = append(os.Environ(), "CMCP_CLI_CHILD=1")
	var stderr bytes.Buffer
	gw.Stdin, gw.Stderr = strings.NewReader(""), &stderr
	gw.Run()
	log := stderr.String()
	if !strings.Contains(log, "upstream unavailable") {
		t.Fatalf("serve did not refuse the spawn:\n%s", log)
	}
	for _, want := range append([]string{"wrote Python bytecode"}, pycacheAdvice...) {
		if !strings.Contains(log, want) {
			t.Errorf("serve's log does not say %q:\n%s", want, log)
		}
	}
}
