package cmcp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// TestQuickstart runs README.md's first block as a newcomer would, in a
// copy of the repository: scripts/quickstart.sh builds, pins and serves;
// scripts/call.sh lists the tools and calls one with curl; Ctrl-C stops the
// gateway, which seals its log; verify-chain says VERIFIED.
func TestQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmcp and runs the quickstart")
	}
	for _, tool := range []string{"bash", "curl", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the quickstart needs %s: %v", tool, err)
		}
	}
	dir := copyRepo(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var logs bytes.Buffer
	srv := exec.Command("bash", "scripts/quickstart.sh", "--listen", addr)
	srv.Dir, srv.Stdout, srv.Stderr = dir, &logs, &logs
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() { syscall.Kill(-srv.Process.Pid, syscall.SIGKILL) })
	deadline := time.Now().Add(10 * time.Minute) // it builds cmcp: minutes on a loaded machine
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("quickstart exited before serving: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("quickstart did not serve on %s\n%s", addr, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	call := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", append([]string{"scripts/call.sh"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CMCP_URL=http://"+addr+"/mcp")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("call.sh %v: %v\n%s\ngateway:\n%s", args, err, out, logs.String())
		}
		return string(out)
	}
	if out := call("--list"); !strings.Contains(out, `"files__echo"`) || !strings.Contains(out, `"files__read_file"`) {
		t.Fatalf("call.sh --list: %s", out)
	}
	out := call("files__echo", `{"text":"hello through cmcp"}`)
	// Exactly what README.md shows.
	calls := readmeBlock(t, "scripts/call.sh --list")
	if want := `{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"hello through cmcp"}]}}` + "\n"; out != want || !strings.Contains(calls, "\n# "+want) {
		t.Fatalf("call.sh files__echo:\n got %q\nwant %q, as README.md's block shows it:\n%s", out, want, calls)
	}
	syscall.Kill(-srv.Process.Pid, syscall.SIGINT) // Ctrl-C
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the gateway did not stop cleanly on Ctrl-C: %v\n%s", err, logs.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("the gateway did not stop on Ctrl-C\n%s", logs.String())
	}
	if want := "audit log sealed; verify it with: cmcp verify-chain " + filepath.Join(dir, "audit"); !strings.Contains(logs.String(), want) {
		t.Errorf("the gateway's log does not end saying %q:\n%s", want, logs.String())
	}
	v := exec.Command(filepath.Join("bin", "cmcp"), "verify-chain", "audit")
	v.Dir = dir
	vout, err := v.CombinedOutput()
	if err != nil || !strings.Contains(string(vout), "VERIFIED") || !strings.Contains(string(vout), "sealed") {
		t.Fatalf("verify-chain audit: %v\n%s", err, vout)
	}
	// The result line README.md shows, with this run's numbers.
	if m := regexp.MustCompile(`(?m)^Result: VERIFIED through record (\d+) of epoch 1: records 0-(\d+) \((\d+) records\) are signed by the newest checkpoint, which is record (\d+) \(tree size (\d+), root `).FindStringSubmatch(string(vout)); m == nil ||
		m[1] != m[2] || m[3] != m[4] || m[4] != m[5] {
		t.Fatalf("verify-chain audit: no result line as README.md shows it:\n%s", vout)
	}
	// README.md shows that line as a run printed it (numbers aside: the
	// gateway signs a checkpoint each second).
	shown := regexp.MustCompile(`(?m)^# (Result: .*)$`).FindStringSubmatch(calls)
	got := regexp.MustCompile(`(?m)^Result: .*$`).FindString(string(vout))
	if digits := regexp.MustCompile(`\d+`); shown == nil || !strings.HasSuffix(shown[1], "root ...)") ||
		!strings.HasPrefix(digits.ReplaceAllString(got, "N"), strings.TrimSuffix(digits.ReplaceAllString(shown[1], "N"), "...)")) {
		t.Fatalf("README.md's block shows the result line\n%v\nbut verify-chain printed\n%s", shown, got)
	}

	// The tour: every command README.md shows runs, in the repository
	// after the quickstart, and says what its comment says.
	tour := readmeBlock(t, "# Pin a stdio server")
	for _, line := range strings.Split(tour, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cmd := exec.Command("bash", "-c", line)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("README.md's tour: %s: %v\n%s", line, err, out)
		}
		want := map[string]string{
			"spawn-digest --name files": "cmcp.yaml entry: paste under upstreams:",
			"--save-checkpoint seen.cp": "Result: VERIFIED",
			"--checkpoint seen.cp":      "consistent with the saved checkpoint",
			"replay audit\x00":          "1 calls",
			"--what-if":                 "0 would change",
			"--provider software":       "",
			"--allow-software":          "WARNING",
		}
		for k, w := range want {
			if strings.Contains(line+"\x00", k) && !strings.Contains(string(out), w) {
				t.Errorf("README.md's tour: %s: the output does not say %q:\n%s", line, w, out)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "r3.proof")); err != nil || !strings.HasPrefix(string(b), "c2sp.org/tlog-proof@v1\n") {
		t.Errorf("README.md's tour: --prove 3 wrote no proof: %v %q", err, b)
	}

	// An MCP client that spawns `cmcp serve --stdio -c .quickstart/cmcp.yaml`
	// from / (as desktop clients do) gets the same sample server: its root
	// is examples/, not the directory cmcp was started in.
	if got := stdioListDir(t, dir, "/"); !strings.Contains(got, "cmcp.yaml") || !strings.Contains(got, "sample-server/") || strings.Contains(got, "etc/") {
		t.Fatalf("files__list_dir . through cmcp serve --stdio started in /: %q, want the listing of examples/", got)
	}
}

// stdioListDir runs `cmcp serve --stdio -c .quickstart/cmcp.yaml` of the
// repository copy repo in the directory cwd, as an MCP client would, and
// returns the text of files__list_dir's answer for ".".
func stdioListDir(t *testing.T, repo, cwd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "bin", "cmcp"), "serve", "--stdio", "-c", filepath.Join(repo, ".quickstart", "cmcp.yaml"))
	cmd.Dir = cwd
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(in, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"quickstart_test","version":"1"}}}`)
	fmt.Fprintln(in, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	fmt.Fprintln(in, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"files__list_dir","arguments":{"path":"."}}}`)
	var answer struct {
		ID     int `json:"id"`
		Result struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
			IsError bool `json:"isError"`
		} `json:"result"`
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &answer); err == nil && answer.ID == 2 {
			break
		}
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("cmcp serve --stdio in %s: %v\n%s", cwd, err, stderr.String())
	}
	if answer.ID != 2 || len(answer.Result.Content) != 1 || answer.Result.IsError {
		t.Fatalf("cmcp serve --stdio in %s: no answer to files__list_dir: %+v\n%s", cwd, answer, stderr.String())
	}
	return answer.Result.Content[0].Text
}

// readmeBlock returns the code block of README.md whose text holds marker.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for i, block := range strings.Split(string(b), "```") {
		if i%2 == 1 && strings.Contains(block, marker) {
			_, body, _ := strings.Cut(block, "\n")
			return body
		}
	}
	t.Fatalf("README.md has no code block holding %q", marker)
	return ""
}

// copyRepo copies the files git tracks (as they are in the working tree)
// into a temporary directory, removed when the test ends. It is the same
// directory for every test of this process: go's build cache knows a
// package by its directory too, so the second quickstart's build of the
// same sources finds the first one's packages instead of compiling them
// all again.
func copyRepo(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("cmcp-quickstart-%d", os.Getpid()))
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		fi, err := os.Stat(name)
		if err != nil {
			continue // deleted in the working tree
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
			t.Fatal(fmt.Errorf("copy %s: %w", name, err))
		}
	}
	return dir
}

// TestQuickstartStopsOnCtrlCBeforeServing: Ctrl-C while the quickstart
// builds stops it (exit 130) before anything is pinned or served, even when
// the step it hits finishes anyway, as a cached `go build` can: bash stops
// a script only when its current command dies of the signal. Here `go`
// ignores SIGINT, so the build always finishes.
func TestQuickstartStopsOnCtrlCBeforeServing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmcp")
	}
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	dir := copyRepo(t)
	bin := t.TempDir()
	wrapper := "#!/bin/sh\ntrap '' INT\necho 'go: building, ignoring SIGINT' >&2\nexec '" + realGo + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := exec.Command("bash", "scripts/quickstart.sh", "--listen", "127.0.0.1:1")
	srv.Dir = dir
	srv.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-srv.Process.Pid, syscall.SIGKILL) })
	var logs strings.Builder
	sc := bufio.NewScanner(stderr)
	interrupted := false
	for sc.Scan() {
		line := sc.Text()
		logs.WriteString(line + "\n")
		if !interrupted && strings.HasPrefix(line, "go: building") {
			syscall.Kill(-srv.Process.Pid, syscall.SIGINT) // Ctrl-C reaches the whole foreground group
			interrupted = true
		}
		if strings.HasPrefix(line, "== pin") || strings.HasPrefix(line, "== cmcp serve") {
			t.Fatalf("the quickstart went on after Ctrl-C:\n%s", logs.String())
		}
	}
	err = srv.Wait()
	var ee *exec.ExitError
	if !interrupted || !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("quickstart after Ctrl-C during the build: %v (interrupted: %v), want exit 130\n%s", err, interrupted, logs.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "audit")); !os.IsNotExist(err) {
		t.Fatalf("an audit log was written after Ctrl-C (%v)", err)
	}
}
