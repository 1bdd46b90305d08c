package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSpawnDigestPinsTheDirOfRelativeArguments: a relative argument that
// names a file (node ./node_modules/srv/index.js) resolved against the
// gateway's working directory, while the target pinned next to it was
// written absolute: the gateway checked the pinned tree where spawn-digest
// ran and executed another file where it was started (found in review).
// The entry now says where the child starts: where the pins were taken.
func TestSpawnDigestPinsTheDirOfRelativeArguments(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "node_modules", "srv"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "node_modules", "srv", "index.js"), []byte("console.log(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	code, out, errOut := runCLI(t, "spawn-digest", "--target", "./node_modules/srv", "--", "/bin/cat", "./node_modules/srv/index.js")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	real, _ := filepath.EvalSymlinks(dir)
	if !strings.Contains(out, `dir: "`+dir+`"`) && !strings.Contains(out, `dir: "`+real+`"`) {
		t.Fatalf("no dir: for the relative argument:\n%s", out)
	}
	// Flags and absolute arguments need no directory.
	code, out, _ = runCLI(t, "spawn-digest", "--", "/bin/cat", "-n", filepath.Join(dir, "node_modules", "srv", "index.js"))
	if code != 0 || strings.Contains(out, "dir:") {
		t.Fatalf("exit %d, absolute arguments got a dir:\n%s", code, out)
	}
}
