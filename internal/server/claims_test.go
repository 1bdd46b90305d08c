package server

import (
	"fmt"
	"os"
	"testing"

	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// TestEachStartSignsWithANewKey: every start of the gateway opens a new
// epoch signed by a freshly generated key (FORMAT.md section 8), so a key
// that leaks from one run cannot sign records of another; the new epoch's
// genesis names the previous one. Each genesis names the digest of the
// gateway's own binary (hashed while the configuration is read).
func TestEachStartSignsWithANewKey(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`version: 1
server: {listen: "127.0.0.1:0", tee: software}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, exe, childEnv, pin)
	var auditDir string
	for i := range 2 {
		t.Run(fmt.Sprintf("start %d", i+1), func(t *testing.T) {
			_, auditDir = serveYAML(t, dir, cfg, os.Environ())
		})
	}
	var geneses []*record.Genesis
	for _, r := range readAuditRecords(t, auditDir) {
		if g, ok := r.(*record.Genesis); ok {
			geneses = append(geneses, g)
		}
	}
	if len(geneses) != 2 {
		t.Fatalf("%d genesis records after two starts, want 2", len(geneses))
	}
	if geneses[0].Key == geneses[1].Key || geneses[0].Key == "" {
		t.Fatalf("both starts signed with key %q", geneses[0].Key)
	}
	// The gateway here is the test binary (Serve runs in it); the child
	// is the program internal/gwtest/child (gwtest.BuildChild), or the
	// test binary too.
	gw, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, want, err := digest.OpenFile(gw)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	for i, g := range geneses {
		if !g.Gateway.Binary.Equal(want) {
			t.Fatalf("genesis %d names binary %s, want %s", i+1, g.Gateway.Binary, want)
		}
	}
	if p := geneses[1].Predecessor; p == nil || p.Epoch != 1 || p.Origin != geneses[0].Origin {
		t.Fatalf("second genesis predecessor = %+v, want epoch 1 %s", p, geneses[0].Origin)
	}
}
