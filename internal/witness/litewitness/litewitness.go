// Package litewitness runs a real witness for tests: litewitness and
// witnessctl from filippo.io/torchwood (v0.6.1, installed by
// scripts/peers.sh, which exports CMCP_LITEWITNESS and CMCP_WITNESSCTL),
// with the witness key held by an in-process ssh-agent as litewitness
// requires.
package litewitness

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// Binaries returns the paths scripts/peers.sh exported, failing the test
// when they are missing (the tests that use them run under the peers tag).
func Binaries(t testing.TB) (litewitness, witnessctl string) {
	t.Helper()
	lw, wc := os.Getenv("CMCP_LITEWITNESS"), os.Getenv("CMCP_WITNESSCTL")
	if lw == "" || wc == "" {
		t.Fatal(`CMCP_LITEWITNESS and CMCP_WITNESSCTL are not set: run eval "$(bash scripts/peers.sh)" first (it installs litewitness v0.6.1)`)
	}
	return lw, wc
}

// Server is one running litewitness.
type Server struct {
	Name string // the witness's name (its key name)
	URL  string // http://127.0.0.1:<port>
	Vkey string // its cosignature verifier key, as litewitness logs it
	DB   string
	ctl  string
	args []string
	pub  ed25519.PublicKey
	cmd  *exec.Cmd
	t    testing.TB
}

// Start runs a litewitness named name with a fresh key, stopped at the
// end of the test.
func Start(t testing.TB, name string) *Server {
	t.Helper()
	lw, ctl := Binaries(t)
	dir, err := os.MkdirTemp("", "lw") // short: the agent socket path must fit a sockaddr
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kr := agent.NewKeyring()
	if err := kr.Add(agent.AddedKey{PrivateKey: priv}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); agent.ServeAgent(kr, c) }()
		}
	}()
	spk, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	s := &Server{Name: name, URL: "http://" + port, DB: filepath.Join(dir, "w.db"), ctl: ctl, t: t}
	s.args = []string{lw, "-db", s.DB, "-name", name, "-key", ssh.FingerprintSHA256(spk), "-ssh-agent", sock, "-listen", port}
	t.Cleanup(s.Stop)
	s.pub = pub
	s.start()
	return s
}

// Restart starts the stopped witness again, with its database and key.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

func (s *Server) start() {
	t := s.t
	t.Helper()
	s.cmd = exec.Command(s.args[0], s.args[1:]...)
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start litewitness: %v", err)
	}
	vk := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			if i := strings.Index(line, "vkey="); i >= 0 && !sent {
				vk <- strings.Trim(strings.Fields(line[i+5:])[0], `"`)
				sent = true
			}
		}
		if !sent {
			close(vk)
		}
	}()
	select {
	case v, ok := <-vk:
		if !ok {
			t.Fatalf("litewitness exited without logging its verifier key")
		}
		s.Vkey = v
	case <-time.After(60 * time.Second):
		t.Fatal("litewitness did not log its verifier key within 60 s")
	}
	if want := cosignatureVkey(s.Name, s.pub); s.Vkey != want {
		t.Fatalf("litewitness logged verifier key %s, want %s", s.Vkey, want)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(s.URL + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("litewitness does not answer on %s: %v", s.URL, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AddLog tells the witness about a log: its origin and note verifier key
// (witnessctl add-log, add-key).
func (s *Server) AddLog(origin, vkey string) {
	s.t.Helper()
	for _, args := range [][]string{{"add-log", "-db", s.DB, "-origin", origin}, {"add-key", "-db", s.DB, "-origin", origin, "-key", vkey}} {
		if out, err := exec.Command(s.ctl, args...).CombinedOutput(); err != nil {
			s.t.Fatalf("witnessctl %s: %v\n%s", args[0], err, out)
		}
	}
}

// Stop stops the witness (SIGINT: a clean shutdown) and waits for it.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}

func freePort(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// cosignatureVkey is the cosignature/v1 verifier key of an Ed25519 key.
func cosignatureVkey(name string, pub ed25519.PublicKey) string {
	raw := append([]byte{0x04}, pub...)
	h := sha256.Sum256(append(append([]byte(name), '\n'), raw...))
	return fmt.Sprintf("%s+%08x+%s", name, uint32(h[0])<<24|uint32(h[1])<<16|uint32(h[2])<<8|uint32(h[3]), base64.StdEncoding.EncodeToString(raw))
}
