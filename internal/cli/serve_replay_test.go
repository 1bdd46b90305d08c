package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// syncBuffer collects a process's output safely (gwtest.LockedWriter).
type syncBuffer = gwtest.LockedWriter

const filesPolicy = `
@id("files")
permit (principal, action, resource in Upstream::"files");

@id("public-only")
forbid (principal, action == Action::"call_tool", resource == Tool::"files__read_file")
when { context.arguments has path && !(context.arguments.path like "public/*") };
`

// TestServeReplayEndToEnd runs a real `cmcp serve` process with the sample
// server as a measured stdio upstream and a pinned policy, makes allowed and
// denied calls, switches the bundle with SIGHUP, stops the gateway, and
// replays its log.
func TestServeReplayEndToEnd(t *testing.T) {
	tmp := t.TempDir()
	server, pin := buildSampleServer(t, tmp)
	data := filepath.Join(tmp, "data")
	os.MkdirAll(filepath.Join(data, "public"), 0o755)
	os.WriteFile(filepath.Join(data, "public", "a.txt"), []byte("public text"), 0o644)
	os.WriteFile(filepath.Join(data, "secret.txt"), []byte("secret text"), 0o644)

	schema, err := os.ReadFile("../../examples/policy/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	bundle := func(name, policies string) (string, digest.Digest) {
		dir := filepath.Join(tmp, name)
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "schema.cedarschema"), schema, 0o644)
		os.WriteFile(filepath.Join(dir, "policy.cedar"), []byte(policies), 0o644)
		d, err := digest.Tree(context.Background(), dir, digest.TreeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return dir, d
	}
	dir1, d1 := bundle("policy-v1", filesPolicy)
	dir2, d2 := bundle("policy-v2", filesPolicy+"\n@id(\"no-echo\")\nforbid (principal, action == Action::\"call_tool\", resource == Tool::\"files__echo\");\n")

	id, _ := age.GenerateX25519Identity()
	idFile := filepath.Join(tmp, "auditor.key")
	os.WriteFile(idFile, []byte(id.String()+"\n"), 0o600)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	auditDir := filepath.Join(tmp, "audit")
	cfgPath := filepath.Join(tmp, "cmcp.yaml")
	writeCfg := func(dir string, expect digest.Digest) {
		cfg := "version: 1\nserver:\n  listen: " + addr + "\n  tee: software\n" +
			"audit:\n  dir: audit\n  recipients: [" + id.Recipient().String() + "]\n  vault: true\n" +
			"upstreams:\n  - name: files\n    stdio:\n      command: " + server + "\n      args: [--root, " + data + "]\n    pin:\n      command: " + pin.String() + "\n" +
			"policy:\n  dir: " + filepath.Base(dir) + "\n  expect: " + expect.String() + "\n  mode: enforcing\n"
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg(dir1, d1)

	var stderr syncBuffer
	gw := exec.Command(os.Args[0], "serve", "-c", cfgPath)
	gw.Env = append(os.Environ(), "CMCP_CLI_CHILD=1")
	gw.Stderr = &stderr
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- gw.Wait() }()
	defer func() {
		if gw.ProcessState == nil {
			gw.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("gateway stderr:\n%s", stderr.String())
		}
	}()

	ctx := context.Background()
	cs := connectWhenServing(t, addr, exited)
	defer cs.Close()
	callTool := func(name string, args map[string]any) (*mcp.CallToolResult, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		return cs.CallTool(cctx, &mcp.CallToolParams{Name: name, Arguments: args})
	}
	denied := func(err error, id string) bool {
		var we *jsonrpc.Error
		return errors.As(err, &we) && strings.Contains(we.Message, id)
	}
	if r, err := callTool("files__read_file", map[string]any{"path": "public/a.txt"}); err != nil || r.IsError {
		t.Fatalf("allowed read: %v %v", r, err)
	}
	if _, err := callTool("files__read_file", map[string]any{"path": "secret.txt"}); !denied(err, "public-only") {
		t.Fatalf("denied read: %v", err)
	}
	if _, err := callTool("files__echo", map[string]any{"text": "hello"}); err != nil {
		t.Fatalf("echo: %v", err)
	}

	// New bundle, pinned in the config, SIGHUP: echo is now denied.
	writeCfg(dir2, d2)
	gw.Process.Signal(syscall.SIGHUP)
	for i := 0; ; i++ {
		_, err := callTool("files__echo", map[string]any{"text": "again"})
		if denied(err, "no-echo") {
			break
		}
		if i > 100 {
			t.Fatalf("reload did not take effect: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cs.Close()
	stopServe(t, gw, exited)
	if !strings.Contains(stderr.String(), "policy reloaded") {
		t.Fatalf("no reload in the gateway log")
	}

	r, err := auditlog.NewReader(auditDir)
	if err != nil {
		t.Fatal(err)
	}
	first, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	g, err := first.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if gen := g.(*record.Genesis); gen.PolicyDigest != d1 || gen.PolicyMode != "enforcing" {
		t.Fatalf("genesis names policy %s (%s), want %s", gen.PolicyDigest, gen.PolicyMode, d1)
	}
	if _, errs, code := run("verify-chain", auditDir); code != 0 {
		t.Fatalf("verify-chain: %d %s", code, errs)
	}
	// Every record the gateway wrote, and what verify-chain, replay and a
	// receipt give programs, match docs/schema (runCLI validates output).
	kinds := validateAuditLog(t, auditDir)
	for _, k := range []string{"genesis", "checkpoint", "spawn", "upstream", "session", "call", "result", "policy", "seal"} {
		if kinds[k] == 0 {
			t.Errorf("the log holds no %s record to check against the schema (%v)", k, kinds)
		}
	}
	if code, _, errs := runCLI(t, "-o", "json", "verify-chain", auditDir); code != 0 {
		t.Fatalf("verify-chain -o json: %d %s", code, errs)
	}
	code, jout, errs := runCLI(t, "-o", "json", "replay", auditDir, "--policy", dir1, "--policy", dir2, "--identity", idFile, "--all")
	var rep struct{ Sessions []struct{ ID string } }
	if err := json.Unmarshal([]byte(jout), &rep); code != 0 || err != nil || len(rep.Sessions) == 0 {
		t.Fatalf("replay -o json: %d %v %s", code, err, errs)
	}
	code, receipt, errs := runCLI(t, "verify-chain", auditDir, "--make-receipt", rep.Sessions[0].ID)
	if code != 0 {
		t.Fatalf("--make-receipt: %d %s", code, errs)
	}
	rf := filepath.Join(tmp, "session.receipt")
	if err := os.WriteFile(rf, []byte(receipt), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runCLI(t, "-o", "json", "verify-chain", "--receipt", rf, "--key", g.(*record.Genesis).Key); code != 0 || !strings.Contains(out, `"status": "verified"`) {
		t.Fatalf("--receipt -o json: %d\n%s%s", code, out, errs)
	}
	out, errs, code := run("replay", auditDir, "--policy", dir1, "--policy", dir2, "--identity", idFile, "--all")
	if code != 0 || !strings.Contains(out, "0 differ, 0 not replayable, 0 tampered") || strings.Contains(out, " 0 same") {
		t.Fatalf("replay: %d\n%s\n%s", code, out, errs)
	}
	// Without it no call is replayable: both bundles read path, so they
	// check its declared type at every call, echo's too (how many echo
	// calls the reload took varies).
	out, errs, code = run("replay", auditDir, "--policy", dir1, "--policy", dir2)
	if m := regexp.MustCompile(`(\d+) calls; replay: 0 same, 0 differ, (\d+) not replayable`).FindStringSubmatch(out); code != 0 || m == nil || m[1] != m[2] {
		t.Fatalf("replay without identity: %d\n%s\n%s", code, out, errs)
	}
	// What if the second bundle had been in force from the start: the
	// echo calls made before the reload would have been denied.
	out, errs, code = run("replay", auditDir, "--what-if", dir2, "--identity", idFile)
	if code != 0 || !strings.Contains(out, "changes to deny (no-echo)") || strings.Contains(out, " 0 would change") || strings.Contains(out, "files__read_file") {
		t.Fatalf("what-if: %d\n%s\n%s", code, out, errs)
	}
	// Someone with the auditors' public key rewrites the sealed payload of
	// the denied read so that it would have been allowed: the commitment in
	// the signed log gives it away.
	tamperVault(t, filepath.Join(auditDir, "epoch-000001", "vault.jsonl"), id, `{"path":"secret.txt"}`, `{"path":"public/a.txt"}`)
	out, errs, code = run("replay", auditDir, "--policy", dir1, "--policy", dir2, "--identity", idFile)
	if code != 30 || !strings.Contains(out, "tampered") || !strings.Contains(out, "1 tampered") {
		t.Fatalf("tampered vault: %d\n%s\n%s", code, out, errs)
	}
}

// tamperVault replaces the vault payload equal to from with to, encrypted to
// the same recipient.
func tamperVault(t *testing.T, path string, id *age.X25519Identity, from, to string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	found := false
	for _, line := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		var vl struct {
			ID  int64  `json:"id,string"`
			Age []byte `json:"age"`
		}
		if err := json.Unmarshal(line, &vl); err != nil {
			t.Fatal(err)
		}
		r, err := age.Decrypt(bytes.NewReader(vl.Age), id)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := io.ReadAll(r)
		if string(p) == from {
			var enc bytes.Buffer
			w, _ := age.Encrypt(&enc, id.Recipient())
			w.Write([]byte(to))
			w.Close()
			vl.Age, found = enc.Bytes(), true
		}
		b, _ := json.Marshal(vl)
		out.Write(append(b, '\n'))
	}
	if !found {
		t.Fatalf("payload %s not in the vault", from)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// connectWhenServing connects an MCP client to a `cmcp serve` process on
// addr once it serves (30 s at most), failing if it exits first.
func connectWhenServing(t *testing.T, addr string, exited <-chan error) *mcp.ClientSession {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := mcp.NewClient(&mcp.Implementation{Name: "cli-test", Version: "1"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", MaxRetries: -1}, nil)
		cancel()
		if err == nil {
			return cs
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not serve: %v", err)
		}
		select {
		case err := <-exited:
			t.Fatalf("gateway exited: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// buildSampleServer builds examples/sample-server into dir and returns its
// path and code pin.
func buildSampleServer(t *testing.T, dir string) (string, digest.Digest) {
	t.Helper()
	server := filepath.Join(dir, "sample-server")
	if out, err := exec.Command("go", "build", "-o", server, "../../examples/sample-server").CombinedOutput(); err != nil {
		t.Fatalf("build the sample server: %v\n%s", err, out)
	}
	f, pin, err := digest.OpenFile(server)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return server, pin
}

// stopServe sends SIGTERM to a `cmcp serve` process and waits (30 s at
// most) for it to exit cleanly.
func stopServe(t *testing.T, gw *exec.Cmd, exited <-chan error) {
	t.Helper()
	gw.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("gateway exit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("gateway did not stop")
	}
}
