package server

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"

	"filippo.io/age"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// gatewayEnv makes the test binary run Serve on the named configuration (a
// real gateway process that the test can SIGKILL).
const gatewayEnv = "CMCP_TEST_GATEWAY"

func runGatewayProcess(cfgPath string) {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(4)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err = Serve(ctx, cfg, ServeOptions{Environ: os.Environ(), Logger: logger, Started: func(endpoint string, _ *gateway.Gateway, _ *auditlog.Writer) {
		fmt.Printf("READY %s\n", endpoint)
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(6)
	}
	os.Exit(0)
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startGatewayProcess runs the gateway as a separate process, with env
// added to this process's environment, and returns its endpoint.
func startGatewayProcess(t *testing.T, cfgPath string, env ...string) (*exec.Cmd, string, *lockedWriter) {
	t.Helper()
	exe, err := os.Executable() // the -race test binary, not the upstream's (selfDigest)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(append(os.Environ(), gatewayEnv+"="+cfgPath), env...)
	out, _ := cmd.StdoutPipe()
	stderr := &lockedWriter{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if ep, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- ep
			}
		}
	}()
	select {
	case ep := <-ready:
		return cmd, ep, stderr
	case <-time.After(2 * time.Minute): // a bound, not a delay: READY ends the wait
		cmd.Process.Kill()
		t.Fatalf("gateway process did not start:\n%s", stderr.String())
	}
	return nil, "", nil
}

func TestSIGKILLUnderLoad(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	seen := filepath.Join(dir, "seen.txt")
	// The auditor's identity opens the arguments' commitments, so that
	// every call the upstream saw is matched to its own call record.
	auditor, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "cmcp.yaml")
	cfgText := fmt.Sprintf(`version: 1
server:
  listen: %s
  tee: software
audit:
  dir: audit
  durability: group
  recipients: [%s]
upstreams:
  - name: t
    stdio:
      command: %s
      env: {%s: server, CMCP_TEST_SEEN: %s}
    pin:
      command: %s
`, freePort(t), auditor.Recipient(), exe, childEnv, seen, pin)
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, endpoint, _ := startGatewayProcess(t, cfgPath)

	// Eight agents call as fast as they can; the gateway is killed mid-way.
	var sent atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := mcp.NewClient(&mcp.Implementation{Name: "load", Version: "1"}, nil)
			cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1}, nil)
			if err != nil {
				return
			}
			defer cs.Close()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__record", Arguments: map[string]any{"text": fmt.Sprintf("a%d-%d", i, n)}})
				cancel()
				if err != nil {
					return
				}
				sent.Add(1)
			}
		}()
	}
	// The kill comes once 200 calls were answered (the agents go on
	// calling: calls are in flight), however long that takes on a loaded
	// machine; a bound of two minutes, not a delay.
	agentsDone := make(chan struct{})
	go func() { wg.Wait(); close(agentsDone) }()
	deadline := time.After(2 * time.Minute)
wait:
	for sent.Load() < 200 {
		select {
		case <-agentsDone:
			break wait
		case <-deadline:
			break wait
		case <-time.After(10 * time.Millisecond):
		}
	}
	if sent.Load() == 0 {
		cmd.Process.Kill()
		t.Fatal("no call was answered before the kill: the test would exercise nothing")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	close(stop)
	wg.Wait()
	t.Logf("%d calls completed before SIGKILL", sent.Load())

	// Restart: the writer recovers the crashed epoch and starts a new one.
	cmd2, _, stderr2 := startGatewayProcess(t, cfgPath)
	cmd2.Process.Signal(syscall.SIGTERM)
	if err := cmd2.Wait(); err != nil {
		t.Fatalf("restarted gateway: %v", err)
	}
	// The operator is told at start that a crashed epoch was recovered.
	if !strings.Contains(stderr2.String(), "recovered the previous epoch") {
		t.Fatalf("the restarted gateway did not report the recovery:\n%s", clip(stderr2.String(), 2000))
	}
	auditDir := filepath.Join(dir, "audit")
	rep, err := auditlog.Verify(auditDir, auditlog.VerifyOptions{})
	if err != nil {
		t.Fatalf("the log does not verify after SIGKILL and restart: %v", err)
	}
	if len(rep.Epochs) != 2 {
		t.Fatalf("epochs: %d", len(rep.Epochs))
	}

	// Pdeathsig and the process group: no child outlived the gateway.
	for _, r := range readRecords(t, auditDir) {
		if r.Kind == "spawn" && r.Body["outcome"] == "started" {
			var pid int
			fmt.Sscan(r.Body["pid"].(string), &pid)
			if pid > 0 && pidAlive(pid) {
				if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(b), exe) {
					t.Errorf("child %d survived the gateway's SIGKILL", pid)
				}
			}
		}
	}

	// Every call the upstream saw has its own call record: its arguments
	// (unique to each call) match the commitment of a forwarded call.
	b, _ := os.ReadFile(seen)
	upstreamSaw := strings.Fields(string(b))
	forwarded := forwardedArgs(t, auditDir, auditor)
	t.Logf("upstream saw %d calls; %d forwarded call records", len(upstreamSaw), len(forwarded))
	if len(upstreamSaw) == 0 {
		t.Fatal("the upstream saw no calls")
	}
	for _, text := range upstreamSaw {
		payload := []byte(fmt.Sprintf(`{"text":%q}`, text))
		found := false
		for _, f := range forwarded {
			if f.o.Check(f.c, payload) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("the upstream saw the call %s, but no forwarded call record commits to its arguments", payload)
		}
	}
}

// forwardedArg is the arguments commitment of one forwarded call record,
// with the opener of its epoch.
type forwardedArg struct {
	o *auditlog.Opener
	c record.Commitment
}

// forwardedArgs reads every epoch of the log in dir and returns the
// arguments commitments of its forwarded call records.
func forwardedArgs(t *testing.T, dir string, id age.Identity) []forwardedArg {
	t.Helper()
	var o *auditlog.Opener
	var out []forwardedArg
	for _, e := range logEntries(t, dir) {
		switch rec := e.Rec.(type) {
		case *record.Genesis:
			var err error
			if o, err = auditlog.NewOpener(rec, id); err != nil {
				t.Fatal(err)
			}
		case *record.Call:
			if rec.Outcome == record.OutcomeForwarded {
				out = append(out, forwardedArg{o, rec.Args})
			}
		}
	}
	return out
}

func TestGracefulShutdownDrains(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cmcp.yaml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server: {listen: %s, tee: software, shutdown_grace: 10s}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: server}}
    pin: {command: %s}
`, freePort(t), exe, childEnv, pin)), 0o600)
	cmd, endpoint, _ := startGatewayProcess(t, cfgPath)
	c := mcp.NewClient(&mcp.Implementation{Name: "drain", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var res *mcp.CallToolResult
	go func() {
		var err error
		res, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "t__sleep", Arguments: map[string]any{"text": "1s"}})
		done <- err
	}()
	// SIGTERM once the call is in flight (its record is written before it
	// is forwarded), not after a fixed delay: under load the call was not
	// sent yet, and the drain found nothing to wait for.
	eventually(t, time.Minute, func() string {
		for _, r := range gwtest.Kinds(readRecords(t, filepath.Join(dir, "audit")), "call") {
			if r.Body["tool"] == "t__sleep" && r.Body["outcome"] == "forwarded" {
				return ""
			}
		}
		return "no forwarded call record of t__sleep yet"
	})
	cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Fatalf("the in-flight call was not drained: %v", err)
	}
	if firstText(res) != "slept 1s" {
		t.Fatalf("result %q", firstText(res))
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gateway exit: %v", err)
	}
	rep, err := auditlog.Verify(filepath.Join(dir, "audit"), auditlog.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Epochs[0].Sealed {
		t.Fatal("the log was not sealed at shutdown")
	}
	rs := readRecords(t, filepath.Join(dir, "audit"))
	if len(kinds(rs, "result")) != 1 || kinds(rs, "seal") == nil {
		t.Fatalf("results %d, seal %v", len(kinds(rs, "result")), kinds(rs, "seal"))
	}
	// The children were stopped by the gateway, before the seal: every
	// started child has its exit record, and none is still running.
	started, exited := map[string]bool{}, map[string]bool{}
	for _, r := range kinds(rs, "spawn") {
		pid, _ := r.Body["pid"].(string)
		switch r.Body["outcome"] {
		case "started":
			started[pid] = true
		case "exited":
			exited[pid] = true
		}
	}
	if len(started) == 0 {
		t.Fatal("no child was started")
	}
	for pid := range started {
		var n int
		fmt.Sscan(pid, &n)
		if !exited[pid] {
			t.Errorf("child %s has no exit record: it was not stopped before the log was sealed", pid)
		}
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n)); n > 0 && pidAlive(n) && strings.Contains(string(b), exe) {
			t.Errorf("child %s outlived the gateway's shutdown", pid)
		}
	}
}

// TestGrandchildDiesWithAKilledGateway: what a child started in its
// process group (npx -> node) does not outlive a gateway killed with
// SIGKILL: the child dies by its parent-death signal, the grandchild by
// the gateway's reaper process (internal/reaper).
func TestGrandchildDiesWithAKilledGateway(t *testing.T) {
	exe, pin := selfDigest(t)
	dir := t.TempDir()
	mark := filepath.Join(dir, "gc.pid")
	cfgPath := filepath.Join(dir, "cmcp.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`version: 1
server: {listen: %s, tee: software}
audit: {dir: audit}
upstreams:
  - name: t
    stdio: {command: %s, env: {%s: grandparent, CMCP_TEST_MARK: %s}}
    pin: {command: %s}
`, freePort(t), exe, childEnv, mark, pin)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, endpoint, _ := startGatewayProcess(t, cfgPath)
	c := mcp.NewClient(&mcp.Implementation{Name: "a", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	child := pidOf(t, cs, "t__pid")
	b, err := os.ReadFile(mark)
	if err != nil {
		t.Fatal(err)
	}
	gc, _ := strconv.Atoi(string(b))
	if !pidAlive(gc) || !pidAlive(child) {
		t.Fatalf("child %d or grandchild %d not running", child, gc)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	eventually(t, 10*time.Second, func() string {
		if pidAlive(child) || pidAlive(gc) {
			return fmt.Sprintf("child %d alive %v, grandchild %d alive %v after the gateway's SIGKILL", child, pidAlive(child), gc, pidAlive(gc))
		}
		return ""
	})
}
