package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// scriptServer writes a "#!" script whose interpreter is the test binary
// (which serves as the upstream), through a symbolic link in its own
// directory that a test can point elsewhere, and returns the script, its
// pin and the link.
func scriptServer(t *testing.T, dir string) (script string, pin digest.Digest, link string) {
	t.Helper()
	exe, _ := selfDigest(t)
	link = filepath.Join(dir, "interp")
	if err := os.Symlink(exe, link); err != nil {
		t.Fatal(err)
	}
	script = filepath.Join(dir, "server")
	if err := os.WriteFile(script, []byte("#!"+link+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, pin, err := digest.OpenFile(script)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return script, pin, link
}

func spawnRecords(t *testing.T, auditDir string) []*record.Spawn {
	t.Helper()
	var out []*record.Spawn
	for _, r := range readAuditRecords(t, auditDir) {
		if s, ok := r.(*record.Spawn); ok && s.Outcome != "exited" {
			out = append(out, s)
		}
	}
	return out
}

// TestScriptInterpreterPinned: the pin of a "#!" script covers its bytes,
// not its interpreter, which anyone who can write it may replace (found in
// review, rev75: the interpreter swapped after pinning ran as
// spawn-measured). The pin's interpreter digest is checked at every spawn:
// pinned, the child runs as spawn-measured and the spawn record names the
// interpreter and its digest; replaced, the spawn is refused with -32062
// naming the upstream and both digests, and recorded; without an
// interpreter digest, refused naming the interpreter; unpinned with
// allow_unmeasured, run as spawn-unmeasured, the record naming it.
func TestScriptInterpreterPinned(t *testing.T) {
	exe, exePin := selfDigest(t)
	serve := func(t *testing.T, pin string) (string, string, string) {
		dir := t.TempDir()
		script, scriptPin, link := scriptServer(t, dir)
		cfg := fmt.Sprintf(`version: 1
server: {listen: "127.0.0.1:0", tee: software}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
`, script, childEnv)
		switch pin {
		case "":
			cfg += "    allow_unmeasured: true\n"
		case "none":
			cfg += fmt.Sprintf("    pin: {command: %s}\n", scriptPin)
		default:
			cfg += fmt.Sprintf("    pin: {command: %s, interpreter: %s}\n", scriptPin, pin)
		}
		endpoint, auditDir := serveYAML(t, dir, cfg, os.Environ())
		return endpoint, auditDir, link
	}
	connect := func(t *testing.T, endpoint string) func(string) error {
		cs, err := connectWith(endpoint, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return func(tool string) error { _, err := call(t, cs, tool, nil); return err }
	}
	t.Run("pinned", func(t *testing.T) {
		endpoint, auditDir, _ := serve(t, exePin.String())
		if err := connect(t, endpoint)("t__echo"); err != nil {
			t.Fatal(err)
		}
		s := spawnRecords(t, auditDir)
		if len(s) == 0 || s[0].Outcome != "started" || s[0].EvidenceClass != "spawn-measured" || !strings.Contains(s[0].Reason, "interpreter "+exe+" digest "+exePin.String()+" pin "+exePin.String()) {
			t.Fatalf("spawn records %+v", s)
		}
	})
	t.Run("interpreter replaced", func(t *testing.T) {
		other := digest.Bytes([]byte("the interpreter that was pinned"))
		endpoint, auditDir, _ := serve(t, other.String())
		err := connect(t, endpoint)("t__echo")
		if wireCode(err) != gateway.CodeUpstreamUnavailable || !strings.Contains(err.Error(), `upstream "t"`) ||
			!strings.Contains(err.Error(), "has digest "+exePin.String()) || !strings.Contains(err.Error(), "but the pin is "+other.String()) {
			t.Fatalf("got %v, want -32062 naming the upstream and both digests", err)
		}
		for _, s := range spawnRecords(t, auditDir) {
			if s.Outcome != "refused" || s.EvidenceClass != "none" || !strings.Contains(s.Reason, "interpreter "+exe+" digest "+exePin.String()+" pin "+other.String()) {
				t.Fatalf("spawn record %+v", s)
			}
		}
	})
	t.Run("no interpreter pin", func(t *testing.T) {
		endpoint, auditDir, _ := serve(t, "none")
		err := connect(t, endpoint)("t__echo")
		if wireCode(err) != gateway.CodeUpstreamUnavailable || !strings.Contains(err.Error(), "#! script for "+exe) || !strings.Contains(err.Error(), "interpreter: "+exePin.String()) {
			t.Fatalf("got %v, want -32062 naming the interpreter and its digest", err)
		}
		s := spawnRecords(t, auditDir)
		if len(s) == 0 || s[0].Outcome != "refused" || !strings.Contains(s[0].Reason, "pin none") {
			t.Fatalf("spawn records %+v", s)
		}
	})
	t.Run("allow_unmeasured", func(t *testing.T) {
		endpoint, auditDir, _ := serve(t, "")
		if err := connect(t, endpoint)("t__echo"); err != nil {
			t.Fatal(err)
		}
		s := spawnRecords(t, auditDir)
		if len(s) == 0 || s[0].Outcome != "started" || s[0].EvidenceClass != "spawn-unmeasured" || !strings.Contains(s[0].Reason, "#! script for "+exe) {
			t.Fatalf("spawn records %+v", s)
		}
	})
}
