package server

import (
	"errors"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr string
		auth bool
		ok   bool
	}{{"127.0.0.1:0", false, true}, {"[::1]:9", false, true}, {"localhost:1", false, true}, {"0.0.0.0:9", false, false}, {"10.1.2.3:9", false, false}, {"0.0.0.0:9", true, true}} {
		err := CheckListen(tc.addr, tc.auth)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, %v) = %v", tc.addr, tc.auth, err)
		}
	}
}

// TestListenMCPChecksTheBoundAddress: listenMCP, which serve binds the MCP
// endpoint with, checks the address it bound, not only the one it was
// given: handed a wildcard address without authentication (as it would be
// if the first check were wrong or skipped), it refuses with exit 4 naming
// the address as given and the address bound, and the listener it bound is
// closed; with authentication, or on loopback, it serves.
func TestListenMCPChecksTheBoundAddress(t *testing.T) {
	for _, tc := range []struct {
		listen string
		ip     net.IP
	}{{"0.0.0.0:0", net.IPv4zero}, {"[::]:0", net.IPv6unspecified}} {
		ln, err := listenMCP(&net.TCPAddr{IP: tc.ip}, tc.listen, false)
		if err == nil {
			ln.Close()
			t.Fatalf("listenMCP(%s) without authentication bound %s", tc.listen, ln.Addr())
		}
		if errors.Is(err, syscall.EAFNOSUPPORT) || errors.Is(err, syscall.EADDRNOTAVAIL) {
			t.Logf("%s: %v (no such address family here)", tc.listen, err)
			continue
		}
		if exitcode.CodeOf(err) != exitcode.ExitConfig || !strings.HasPrefix(err.Error(), tc.listen+": refusing to listen on ") {
			t.Fatalf("listenMCP(%s) without authentication: %v (exit %d), want exit 4 refusing the bound address", tc.listen, err, exitcode.CodeOf(err))
		}
		m := regexp.MustCompile(`refusing to listen on (\S+):(\d+) without authentication`).FindStringSubmatch(err.Error())
		if m == nil || m[2] == "0" {
			t.Fatalf("the refusal does not name the bound address and port: %v", err)
		}
		if c, err := net.Dial("tcp", net.JoinHostPort("localhost", m[2])); err == nil {
			c.Close()
			t.Fatalf("the refused listener on port %s still accepts connections", m[2])
		}
	}
	for _, tc := range []struct {
		addr *net.TCPAddr
		auth bool
	}{{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, false}, {&net.TCPAddr{IP: net.IPv4zero}, true}} {
		ln, err := listenMCP(tc.addr, tc.addr.String(), tc.auth)
		if err != nil {
			t.Fatalf("listenMCP(%s, authenticated %v): %v", tc.addr, tc.auth, err)
		}
		ln.Close()
	}
}
