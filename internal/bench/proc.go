package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Process is a child process the benchmark started (an upstream or a
// gateway), stopped with SIGTERM then SIGKILL.
type Process struct {
	Cmd    *exec.Cmd
	stderr *strings.Builder
	done   chan error
}

// Start runs name with args, its stderr captured for error messages.
func Start(name string, args []string, env []string) (*Process, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = env
	var se strings.Builder
	cmd.Stderr = &limitedWriter{b: &se, max: 64 << 10}
	cmd.SysProcAttr = withPdeathsig(&syscall.SysProcAttr{Setpgid: true})
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Cmd: cmd, stderr: &se, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Stderr returns what the process wrote to stderr so far (bounded).
func (p *Process) Stderr() string { return p.stderr.String() }

// Stop sends SIGTERM to the process group, SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) error {
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(grace):
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		return <-p.done
	}
}

// WaitHTTP waits until url answers any HTTP response, the process exits, or
// timeout passes.
func (p *Process) WaitHTTP(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("%s exited before serving (%v): %s", p.Cmd.Path, err, p.Stderr())
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not serve %s within %v: %s", p.Cmd.Path, url, timeout, p.Stderr())
}

type limitedWriter struct {
	b   *strings.Builder
	max int
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if room := w.max - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// FreeAddr returns a free 127.0.0.1 TCP address.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// NewClient is the one go-sdk client every measurement uses.
func NewClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "cmcp-bench", Version: "1"}, nil)
}

// StdioConnector spawns command for every session (the way a local client
// runs a stdio server) and talks to it directly.
func StdioConnector(command string, args ...string) Connector {
	return func(ctx context.Context) (*mcp.ClientSession, error) {
		cmd := exec.Command(command, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		return NewClient().Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	}
}

// HTTPConnector opens a Streamable HTTP session with endpoint; a non-empty
// token is sent as a bearer token.
func HTTPConnector(endpoint, token string) Connector {
	client := &http.Client{Transport: &bearer{token: token, base: &http.Transport{MaxIdleConnsPerHost: 64}}}
	return func(ctx context.Context) (*mcp.ClientSession, error) {
		return NewClient().Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: client}, nil)
	}
}

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.token == "" {
		return b.base.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// ErrNoPeers explains how to install the peers the benchmark needs.
var ErrNoPeers = errors.New(`CMCP_EVERYTHING_SERVER is not set: run  eval "$(bash scripts/peers.sh)"  first (or use scripts/bench.sh)`)
