package config

import (
	"fmt"
	"net"
	"strings"
)

// position is where a value is in the configuration file.
type position struct{ line, col int }

// ListenCheck is what CheckListeners found that is not an error: the
// resolved addresses, and warnings for the operator.
type ListenCheck struct {
	// MCP is the resolved address of the MCP endpoint (nil with stdio).
	MCP *net.TCPAddr
	// Warnings name settings that send a credential over the network in
	// cleartext.
	Warnings []string
}

// CheckListeners checks the addresses `cmcp serve` is about to listen on,
// after --listen (flag, "" when not given) has overridden server.listen,
// and before anything is opened or started. Host names are resolved as
// net.Listen resolves them. Without bearer tokens or mutual TLS the MCP
// endpoint must be on a loopback address, and the admin listener may not
// share the MCP endpoint's address: the same port on the same address,
// "localhost" and 127.0.0.1 being the same, or on a wildcard address
// (0.0.0.0, ::, "") that takes the port on every address. With stdio
// there is no MCP listener. Errors name the setting's line, or --listen.
func (c *Config) CheckListeners(flag string, stdio bool) (*ListenCheck, error) {
	out := &ListenCheck{}
	s := c.Server
	if s == nil {
		s = &Server{}
	}
	var errs Errors
	report := func(field string, p position, hint, format string, args ...any) {
		errs = append(errs, &Error{File: c.Path, Line: p.line, Col: p.col, Field: field, Msg: fmt.Sprintf(format, args...), Hint: hint})
	}
	listen, mcpField, mcpPos, mcpSource := s.ListenOrDefault(), "server.listen", c.pos["server.listen"], "server.listen"
	switch {
	case flag != "":
		listen, mcpField, mcpPos, mcpSource = flag, "--listen", position{}, "--listen"
	case s.Listen == "":
		mcpSource = "server.listen, by default"
	}
	if !stdio {
		a, err := net.ResolveTCPAddr("tcp", listen)
		if err != nil {
			report(mcpField, mcpPos, "give a host:port of this machine, e.g. "+DefaultListen, "%v", err)
			return nil, errs
		}
		out.MCP = a
		authenticated := len(s.Tokens) > 0 || s.OAuth != nil || (s.TLS != nil && s.TLS.ClientCA != "")
		switch {
		case !authenticated && !isLoopback(a):
			report(mcpField, mcpPos, "configure bearer tokens (server.tokens), OAuth (server.oauth) or mutual TLS (server.tls.client_ca), or listen on a loopback address such as "+DefaultListen,
				"refusing to listen on %s without authentication: it is not a loopback address, and none of server.tokens, server.oauth and server.tls.client_ca is set", describe(listen, a))
		case (len(s.Tokens) > 0 || s.OAuth != nil) && s.TLS == nil && !isLoopback(a):
			out.Warnings = append(out.Warnings, fmt.Sprintf("%s %s is not a loopback address and server.tls is not set: agents' bearer tokens cross the network in cleartext (configure server.tls)", mcpSource, describe(listen, a)))
		}
	}
	if c.Admin != nil && c.Admin.Listen != "" {
		p := c.pos["admin.listen"]
		a, err := net.ResolveTCPAddr("tcp", c.Admin.Listen)
		switch {
		case err != nil:
			report("admin.listen", p, "give a host:port of this machine, e.g. 127.0.0.1:9090", "%v", err)
		case out.MCP != nil && sameListener(a, out.MCP):
			report("admin.listen", p, "give the admin listener its own port, e.g. 127.0.0.1:9090",
				"%s is also the MCP endpoint's address (%s %s): the admin listener needs its own address", describe(c.Admin.Listen, a), mcpSource, listen)
		case !isLoopback(a):
			out.Warnings = append(out.Warnings, fmt.Sprintf("admin.listen %s is not a loopback address and the admin listener has no TLS: the admin token crosses the network in cleartext", describe(c.Admin.Listen, a)))
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

// IsLoopbackListener reports whether a listener bound to addr accepts
// connections from this machine only.
func IsLoopbackListener(addr net.Addr) bool {
	a, ok := addr.(*net.TCPAddr)
	return ok && isLoopback(a)
}

func isLoopback(a *net.TCPAddr) bool { return a.IP != nil && a.IP.IsLoopback() }

// sameListener reports whether listening on a and then on b fails: the same
// port (not 0, which picks a free one) on the same address, or on a
// wildcard address, which takes the port on every address.
func sameListener(a, b *net.TCPAddr) bool {
	if a.Port != b.Port || a.Port == 0 {
		return false
	}
	wild := func(ip net.IP) bool { return ip == nil || ip.IsUnspecified() }
	return wild(a.IP) || wild(b.IP) || a.IP.Equal(b.IP)
}

// describe is addr, with the address it resolved to when that differs.
func describe(addr string, a *net.TCPAddr) string {
	if a.String() == addr || a.IP == nil {
		return addr
	}
	return fmt.Sprintf("%s (%s)", addr, a)
}

// sameListenerLiteral is sameListener for Load, which does not resolve host
// names: it compares IP literals and "localhost" (as 127.0.0.1), and other
// names as written.
func sameListenerLiteral(x, y string) bool {
	a, aok := literalAddr(x)
	b, bok := literalAddr(y)
	if aok && bok {
		return sameListener(a, b)
	}
	return strings.EqualFold(x, y)
}

func literalAddr(s string) (*net.TCPAddr, bool) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return nil, false
	}
	if strings.EqualFold(host, "localhost") {
		host = "127.0.0.1"
	}
	if host != "" && net.ParseIP(host) == nil {
		return nil, false
	}
	a, err := net.ResolveTCPAddr("tcp", net.JoinHostPort(host, port)) // no lookup: a literal address and a numeric or service port
	return a, err == nil
}
