package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The vendor libraries' testing packages embed known private keys (fake AMD
// ARK/ASK/VCEK) and register flags: they must never be linked into cmcp.
func TestBinaryHasNoVendorTestingPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	forbidden := []string{
		"github.com/google/go-sev-guest/testing",
		"github.com/google/go-tdx-guest/testing",
		"github.com/google/go-configfs-tsm/configfs/faketsm",
		"github.com/google/go-configfs-tsm/configfs/fakertmr",
	}
	seen := map[string]bool{}
	for _, d := range deps {
		seen[d] = true
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("cmcp links %s", d)
			}
		}
	}
	// The check means something only if the vendor libraries are linked.
	for _, want := range []string{"github.com/google/go-sev-guest/client", "github.com/google/go-tdx-guest/client", "github.com/google/go-sev-guest/abi", "github.com/confidential-mcp/cmcp/pkg/evidence"} {
		if !seen[want] {
			t.Errorf("cmcp does not link %s: the import-graph check is vacuous", want)
		}
	}
}

// pkg/evidence is an offline package: it imports no network package itself
// (the vendor verifiers it calls have their KDS/PCS fetching disabled).
func TestEvidenceImportsNoNetwork(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{join .Imports \"\\n\"}}", "github.com/confidential-mcp/cmcp/pkg/evidence").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, imp := range strings.Fields(string(out)) {
		if imp == "net/http" || imp == "net" || strings.HasPrefix(imp, "net/http/") {
			t.Errorf("pkg/evidence imports %s", imp)
		}
	}
}
