package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
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

func spawnRecords(t *testing.T, auditDir string) []*auditlog.Spawn {
	t.Helper()
	var out []*auditlog.Spawn
	for _, r := range readAuditRecords(t, auditDir) {
		if s, ok := r.(*auditlog.Spawn); ok && s.Outcome != "exited" {
			out = append(out, s)
		}
	}
	return out
}

// TestPinnedScriptWithUnpinnedInterpreterIsRefused: the pin of a "#!"
// script covers its bytes, not its interpreter, which anyone who can
// write it may replace (found in review, rev75: the interpreter swapped
// after pinning ran as spawn-measured). Such a spawn is refused, the agent
// told which interpreter is not pinned, the refusal recorded; unpinned
// with allow_unmeasured it runs as spawn-unmeasured, the record naming the
// interpreter.
func TestPinnedScriptWithUnpinnedInterpreterIsRefused(t *testing.T) {
	exe, _ := selfDigest(t)
	t.Run("pinned", func(t *testing.T) {
		dir := t.TempDir()
		script, pin, _ := scriptServer(t, dir)
		endpoint, auditDir := serveYAML(t, dir, fmt.Sprintf(`version: 1
server: {listen: "127.0.0.1:0", tee: software}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, script, childEnv, pin), os.Environ())
		cs, err := connectWith(endpoint, "")
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		_, err = call(t, cs, "t__echo", nil)
		if wireCode(err) != CodeUpstreamUnavailable || !strings.Contains(err.Error(), `upstream "t"`) || !strings.Contains(err.Error(), "#! script for "+exe) {
			t.Fatalf("got %v, want upstream-unavailable naming the interpreter %s", err, exe)
		}
		spawns := spawnRecords(t, auditDir)
		if len(spawns) == 0 {
			t.Fatal("no spawn record")
		}
		for _, s := range spawns {
			if s.Outcome != "refused" || !strings.Contains(s.Reason, exe) || s.EvidenceClass == "spawn-measured" {
				t.Fatalf("spawn record %+v", s)
			}
		}
	})
	t.Run("allow_unmeasured", func(t *testing.T) {
		dir := t.TempDir()
		script, _, _ := scriptServer(t, dir)
		endpoint, auditDir := serveYAML(t, dir, fmt.Sprintf(`version: 1
server: {listen: "127.0.0.1:0", tee: software}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    allow_unmeasured: true
`, script, childEnv), os.Environ())
		cs, err := connectWith(endpoint, "")
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if _, err := call(t, cs, "t__echo", nil); err != nil {
			t.Fatal(err)
		}
		spawns := spawnRecords(t, auditDir)
		if len(spawns) == 0 || spawns[0].Outcome != "started" || spawns[0].EvidenceClass != "spawn-unmeasured" || !strings.Contains(spawns[0].Reason, "#! script for "+exe) {
			t.Fatalf("spawn records %+v", spawns)
		}
	})
}
