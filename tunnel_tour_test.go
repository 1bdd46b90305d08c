package cmcp_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTunnelTour runs the README's two-machine tour as written, in a
// copy of the repository, on a free port instead of 8080: the gateway, two
// connectors with the same pinned sample server, the refusal without
// machineId listing both machines, a call to each by machineId, one
// connector killed (a call needs no id then), and started again.
func TestTunnelTour(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmcp and runs the tunnel tour")
	}
	for _, tool := range []string{"bash", "curl", "sha256sum", "base64"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the tour needs %s: %v", tool, err)
		}
	}
	doc, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	tour := string(doc[strings.Index(string(doc), "## Machines behind NAT: a two-machine tour"):])
	if end := strings.Index(tour[3:], "\n## "); end >= 0 {
		tour = tour[:3+end]
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(tour, -1)
	if len(blocks) != 2 {
		t.Fatalf("the tour has %d sh blocks, want 2", len(blocks))
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	setup := strings.ReplaceAll(blocks[0][1], "127.0.0.1:8080", addr)
	// The tour's go build lines run here, in the module (the build cache
	// makes them quick), into the directory the tour runs in, which has
	// examples/ and scripts/ as the repository's.
	dir := t.TempDir()
	var kept []string
	for _, line := range strings.Split(setup, "\n") {
		if rest, ok := strings.CutPrefix(line, "go build -trimpath -o "); ok {
			out, pkg, _ := strings.Cut(rest, " ")
			b := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, out), pkg)
			if msg, err := b.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", line, err, msg)
			}
			continue
		}
		kept = append(kept, line)
	}
	setup = strings.Join(kept, "\n")
	for _, d := range []string{"examples", "scripts"} {
		abs, _ := filepath.Abs(d)
		if err := os.Symlink(abs, filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	// The agent's part, each step marked, after waiting for both machines.
	var agent strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(blocks[1][1]), "\n") {
		cmd, _, _ := strings.Cut(line, "  #")
		cmd = strings.TrimSpace(cmd)
		agent.WriteString("echo '== " + strings.ReplaceAll(cmd, "'", "") + "'\n")
		if strings.HasPrefix(cmd, "kill %2") {
			// Until the gateway saw it go: a call without id then works.
			agent.WriteString(cmd + "\nwait %2 || true\nfor i in $(seq 600); do scripts/call.sh files__echo '{\"text\":\"one\"}' | grep -q isError || break; sleep 0.1; done\n")
			continue
		}
		agent.WriteString(cmd + "\n")
	}
	script := "set -e\nexport CMCP_URL=http://" + addr + "/mcp\n" + setup +
		`for i in $(seq 1200); do
  a=$(scripts/call.sh files__echo '{"text":"w","machineId":"lab-1"}' 2>/dev/null || true)
  b=$(scripts/call.sh files__echo '{"text":"w","machineId":"lab-2"}' 2>/dev/null || true)
  case "$a$b" in *isError*|"") sleep 0.1 ;; *) break ;; esac
done
` + agent.String() +
		`echo '== lab-1 again'
bin/cmcp connect --gateway http://` + addr + `/tunnel --token-file machine.token --name files --machine-id lab-1 --pin "$PIN" -- bin/sample-server --root examples &
for i in $(seq 600); do
  out=$(scripts/call.sh files__echo '{"text":"back","machineId":"lab-1"}' 2>/dev/null || true)
  case "$out" in *isError*|"") sleep 0.1 ;; *) echo "$out"; break ;; esac
done
kill $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true
`
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done := make(chan struct{})
	time.AfterFunc(4*time.Minute, func() {
		select {
		case <-done:
		default:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	})
	out, err := cmd.CombinedOutput()
	close(done)
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	text := string(out)
	if err != nil {
		t.Fatalf("tour: %v\n%s", err, text)
	}
	// The steps in order: each marker line, then what the step printed.
	steps := strings.Split(text, "\n== ")[1:]
	want := []struct{ step, has, hasNot string }{
		{"scripts/call.sh --list", `"files__echo"`, ""},
		{`scripts/call.sh files__echo {"text":"hi"}`, "live machines: lab-1, lab-2", ""},
		{`scripts/call.sh files__echo {"text":"hi","machineId":"lab-1"}`, `"text":"hi"`, "isError"},
		{`scripts/call.sh files__echo {"text":"hi","machineId":"lab-2"}`, `"text":"hi"`, "isError"},
		{"kill %2", "", ""},
		{`scripts/call.sh files__echo {"text":"hi"}`, `"text":"hi"`, "isError"},
		{"lab-1 again", `"text":"back"`, "isError"},
	}
	if len(steps) != len(want) {
		t.Fatalf("%d steps ran, want %d:\n%s", len(steps), len(want), text)
	}
	for i, w := range want {
		s := steps[i]
		if !strings.HasPrefix(s, w.step) {
			t.Fatalf("step %d is %q, want %q", i, strings.SplitN(s, "\n", 2)[0], w.step)
		}
		if !strings.Contains(s, w.has) || (w.hasNot != "" && strings.Contains(s, w.hasNot)) {
			t.Errorf("step %s: want %q (and no %q) in:\n%s", w.step, w.has, w.hasNot, s)
		}
	}
}
