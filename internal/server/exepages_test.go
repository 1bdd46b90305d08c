package server

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exepages"
)

// exeReadOnlyRSS is the resident size of process pid's read-only
// mappings of the file exe (its text and read-only data), from outside:
// reading another process's smaps touches none of its pages.
func exeReadOnlyRSS(t *testing.T, pid int, exe string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var total int64
	var in bool
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 {
			continue
		}
		if !strings.HasSuffix(fs[0], ":") {
			in = len(fs) >= 6 && fs[5] == exe && !strings.Contains(fs[1], "w")
			continue
		}
		if in && fs[0] == "Rss:" {
			kb, err := strconv.ParseInt(fs[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			total += kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}

// TestServeReleasesStartPages: a started gateway process holds far fewer
// of its executable's read-only pages than one started with
// CMCP_KEEP_EXE_PAGES=1, and serves calls as well (the pages it needs
// come back from the page cache).
func TestServeReleasesStartPages(t *testing.T) {
	exe, pin := selfDigest(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if self, err = filepath.EvalSymlinks(self); err != nil {
		t.Fatal(err)
	}
	start := func(env ...string) (pid int, endpoint string) {
		dir := t.TempDir()
		cfgPath := filepath.Join(dir, "cmcp.yaml")
		cfgText := fmt.Sprintf(`version: 1
server:
  listen: %s
  tee: software
audit:
  dir: audit
upstreams:
  - name: t
    stdio:
      command: %s
      env: {%s: server}
    pin:
      command: %s
`, freePort(t), exe, childEnv, pin)
		if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd, endpoint, _ := startGatewayProcess(t, cfgPath, env...)
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid, endpoint
	}
	keptPid, _ := start(exepages.KeepEnv + "=1")
	pid, endpoint := start()
	kept, released := exeReadOnlyRSS(t, keptPid, self), exeReadOnlyRSS(t, pid, self)
	t.Logf("read-only pages of the executable resident once serving: %d KiB kept, %d KiB released", kept>>10, released>>10)
	if kept == 0 || released*2 > kept {
		t.Errorf("the gateway holds %d bytes of its executable's read-only pages, the one with %s=1 %d: want under half", released, exepages.KeepEnv, kept)
	}

	cs, err := connectWith(endpoint, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for i := range 3 {
		r, err := call(t, cs, "t__echo", map[string]any{"text": fmt.Sprint("hello ", i)})
		if err != nil {
			t.Fatalf("call %d after the release: %v", i, err)
		}
		if got := firstText(r); !strings.Contains(got, fmt.Sprint("hello ", i)) {
			t.Fatalf("call %d after the release answered %q", i, got)
		}
	}
}
