package config

import (
	"errors"
	"fmt"
	"net"
	"net/textproto"
	"net/url"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Upstream is one entry of the `upstreams:` section: an MCP server that the
// gateway spawns (stdio) or dials (http). Exactly one of Stdio and HTTP is set.
//
//	upstreams:
//	  - name: files                 # [A-Za-z0-9_-], 1 to 32 characters, no "__"
//	    stdio:
//	      command: cmcp-sample-server   # a name looked up on PATH, or a path
//	      args: [--root, /srv/data]
//	      dir: /srv                     # working directory (default: the gateway's)
//	      env: {LOG_LEVEL: info}        # set explicitly in the child
//	      env_allow: [PATH, HOME]       # copied from the gateway's environment
//	                                    # (no code-loading variables, no credentials of
//	                                    # other upstreams, no CMCP_*)
//	      sealed: false                 # true: run a sealed memfd copy (static binaries; Linux)
//	    pin:                            # from `cmcp spawn-digest`
//	      command: sha256:...           # the resolved command file
//	      target: ./server              # optional: a script or package directory
//	      target_digest: sha256:...     # its file or tree digest
//	    lifecycle: per-session          # per-session (default) or shared
//	    warm_spares: 0                  # per-session children/sessions kept ready (0-16)
//	    namespace: true                 # expose tools as files__<tool> (default)
//	  - name: remote
//	    http:
//	      url: https://mcp.example.com/mcp
//	      tls_pin: sha256:...           # SHA-256 of the server's SubjectPublicKeyInfo
type Upstream struct {
	Name  string `yaml:"name" json:"name"`
	Stdio *Stdio `yaml:"stdio" json:"stdio,omitempty"`
	HTTP  *HTTP  `yaml:"http" json:"http,omitempty"`
	// Tunnel is an upstream served by machines that dial in with `cmcp
	// connect` (docs/tunnel.md).
	Tunnel *Tunnel `yaml:"tunnel" json:"tunnel,omitempty"`
	// Pin is the digest of the code a stdio upstream runs.
	Pin *Pin `yaml:"pin" json:"pin,omitempty"`
	// AllowUnmeasured lets a stdio upstream without a pin run, recorded
	// with the evidence class spawn-unmeasured.
	AllowUnmeasured bool `yaml:"allow_unmeasured" json:"allow_unmeasured,omitempty"`
	// AllowCodeEnv lets a stdio upstream's env and env_allow name
	// variables that load code (PYTHONPATH, LD_PRELOAD, NODE_OPTIONS: see
	// CodeLoadingEnv), which Load otherwise refuses; every spawn of the
	// upstream is then recorded with the evidence class spawn-unmeasured.
	AllowCodeEnv bool `yaml:"allow_code_env" json:"allow_code_env,omitempty"`
	// Lifecycle is LifecyclePerSession (default) or LifecycleShared.
	Lifecycle string `yaml:"lifecycle" json:"lifecycle,omitempty"`
	// Namespace exposes tools as "<name>__<tool>"; default true.
	Namespace *bool `yaml:"namespace" json:"namespace,omitempty"`
	// WarmSpares is how many connections of a per-session upstream (stdio
	// children, HTTP sessions) the gateway keeps started, measured and
	// initialised ahead of demand, each handed to one agent session and
	// never reused; 0 (the default) keeps none.
	WarmSpares int `yaml:"warm_spares" json:"warm_spares,omitempty"`
}

// MaxWarmSpares bounds an upstream's warm_spares.
const MaxWarmSpares = 16

// Stdio describes how to spawn a stdio upstream.
type Stdio struct {
	// Command is a program name looked up on PATH (absolute entries only)
	// or a path; Load makes a relative path (one with a slash) absolute,
	// relative to the configuration file.
	Command string   `yaml:"command" json:"command,omitempty"`
	Args    []string `yaml:"args" json:"args,omitempty"`
	// Dir is the child's working directory; Load makes it absolute.
	Dir string `yaml:"dir" json:"dir,omitempty"`
	// Env sets variables in the child explicitly.
	Env map[string]string `yaml:"env" json:"env,omitempty"`
	// EnvAllow names variables copied from the gateway's environment; nil
	// means the gateway's default list.
	EnvAllow []string `yaml:"env_allow" json:"env_allow,omitempty"`
	// Sealed runs a sealed in-memory copy of the executable, which nothing
	// can change while it runs; the program then sees the copy (a memfd) as
	// its own path, which interpreters (node, npx, python) cannot use.
	Sealed bool `yaml:"sealed" json:"sealed,omitempty"`
}

// Pin is what a stdio upstream's code must digest to.
type Pin struct {
	// Command is the digest of the resolved command file (digest.File).
	Command digest.Digest `yaml:"command" json:"command,omitzero"`
	// Target is an extra measure target for interpreted servers: a script
	// (file digest) or a package directory (tree digest). Load makes it
	// absolute, relative to the configuration file.
	Target string `yaml:"target" json:"target,omitempty"`
	// TargetDigest is the digest Target must have.
	TargetDigest digest.Digest `yaml:"target_digest" json:"target_digest,omitzero"`
	// Interpreter is the digest of the interpreter of a "#!" command: the
	// program named after "#!" (its real file), or for "#!/usr/bin/env
	// NAME" the NAME found on the child's PATH. A pinned "#!" command
	// without it is refused: the command's digest covers the script only.
	Interpreter digest.Digest `yaml:"interpreter" json:"interpreter,omitzero"`
}

// HTTP describes a Streamable HTTP upstream.
type HTTP struct {
	URL string `yaml:"url" json:"url,omitempty"`
	// TLSPin is the SHA-256 of the server's SubjectPublicKeyInfo; with it
	// the CA chain is not consulted.
	TLSPin digest.Digest `yaml:"tls_pin" json:"tls_pin,omitzero"`
	// CAFile is a PEM file of roots for an unpinned https:// server; Load
	// makes it absolute.
	CAFile string `yaml:"ca_file" json:"ca_file,omitempty"`
	// AllowRemotePlaintext permits http:// to a non-loopback host.
	AllowRemotePlaintext bool `yaml:"allow_remote_plaintext" json:"allow_remote_plaintext,omitempty"`
	// BearerTokenEnv / BearerTokenFile name where the upstream's bearer
	// token is (at most one); the token itself never appears in the file.
	BearerTokenEnv  string `yaml:"bearer_token_env" json:"bearer_token_env,omitempty"`
	BearerTokenFile string `yaml:"bearer_token_file" json:"bearer_token_file,omitempty"`
	// HeadersFromEnv / HeadersFromFile map header names to the environment
	// variable / file holding the value.
	HeadersFromEnv  map[string]string `yaml:"headers_from_env" json:"headers_from_env,omitempty"`
	HeadersFromFile map[string]string `yaml:"headers_from_file" json:"headers_from_file,omitempty"`
	// ConnectTimeout bounds connect and TLS handshake, e.g. "10s".
	ConnectTimeout time.Duration `yaml:"connect_timeout" json:"connect_timeout,omitempty"`
	// Credential mints the credential for each calling identity (see
	// CredentialSource); nil: the static credentials above, or none.
	Credential *CredentialSource `yaml:"credential" json:"credential,omitempty"`
}

// Endpoint is URL without its query and user info, either of which may
// hold a secret (?api_key=...): the url to show in messages and output.
func (h *HTTP) Endpoint() string {
	u, err := url.Parse(h.URL)
	if err != nil {
		return "(an unparsable url)"
	}
	return RedactedURL(u)
}

// RedactedURL is u without its user info and query, either of which may
// hold a secret.
func RedactedURL(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.ForceQuery = nil, "", false
	return c.String()
}

// Lifecycles of an upstream connection.
const (
	LifecyclePerSession = "per-session"
	LifecycleShared     = "shared"
)

// MaxNameLen is the longest upstream name: "<name>__<tool>" must stay
// within the 64 characters every major MCP client accepts.
const MaxNameLen = 32

var (
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ValidateName checks an upstream name: 1 to MaxNameLen characters from
// [A-Za-z0-9_-], without "__" (the namespace separator).
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("the name is empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("name %q is %d characters; at most %d", name, len(name), MaxNameLen)
	case !nameRE.MatchString(name):
		return fmt.Errorf("name %q: use only letters, digits, '_' and '-'", name)
	case strings.Contains(name, "__"):
		return fmt.Errorf("name %q contains \"__\", the separator of namespaced tool names", name)
	}
	return nil
}

// Namespaced reports whether tools are exposed as "<name>__<tool>".
func (u *Upstream) Namespaced() bool { return u.Namespace == nil || *u.Namespace }

// Shared reports whether one connection serves every session.
func (u *Upstream) Shared() bool { return u.Lifecycle == LifecycleShared }

// Upstream returns the upstream called name, or nil.
func (c *Config) Upstream(name string) *Upstream {
	for i := range c.Upstreams {
		if c.Upstreams[i].Name == name {
			return &c.Upstreams[i]
		}
	}
	return nil
}

// upstreamEntry is where one upstream entry is in the file, for errors:
// its YAML node (nil when there is none) and its field name, like
// "upstreams[2] (files)".
type upstreamEntry struct {
	n *yaml.Node
	f string
}

// newUpstreamEntry locates upstream i (u) in seq, the upstreams section.
func newUpstreamEntry(seq *yaml.Node, i int, u *Upstream) upstreamEntry {
	e := upstreamEntry{f: fmt.Sprintf("upstreams[%d]", i)}
	if seq != nil && i < len(seq.Content) {
		e.n = seq.Content[i]
	}
	if u.Name != "" {
		e.f = fmt.Sprintf("upstreams[%d] (%s)", i, u.Name)
	}
	return e
}

// at is the node of the entry's key, or the entry's when the key is absent.
func (e upstreamEntry) at(key string) *yaml.Node {
	if v := valueNode(e.n, key); v != nil {
		return v
	}
	return e.n
}

// in is the node of key in the entry's section, or the section's (or the
// entry's) when absent.
func (e upstreamEntry) in(section, key string) *yaml.Node {
	if v := valueNode(valueNode(e.n, section), key); v != nil {
		return v
	}
	return e.at(section)
}

// validateUpstreams checks the upstreams section; seq is its YAML node.
func (l *loader) validateUpstreams(c *Config, seq *yaml.Node, dir string) {
	seen := map[string]*yaml.Node{}
	creds := credentialEnv(c)
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		e := newUpstreamEntry(seq, i, u)
		l.validateUpstreamName(e, u, seen)
		l.validateUpstreamLifecycle(e, u, len(c.Upstreams))
		if !l.validateUpstreamKind(e, u) {
			continue
		}
		switch {
		case u.Tunnel != nil:
			l.validateTunnel(e.n, e.f, u)
		case u.HTTP != nil:
			l.validateHTTPUpstream(e, u, dir)
		default:
			l.validateStdioUpstream(e, u, dir, creds)
		}
	}
}

// validateUpstreamName checks u's name and that no earlier upstream (seen:
// name -> its node) has it, and adds it to seen.
func (l *loader) validateUpstreamName(e upstreamEntry, u *Upstream, seen map[string]*yaml.Node) {
	if err := ValidateName(u.Name); err != nil {
		l.errorf(e.at("name"), e.f+".name", "upstream names become tool prefixes: name__tool", "%v", err)
	} else if prev, dup := seen[u.Name]; dup {
		l.errorf(e.at("name"), e.f+".name", "give every upstream its own name", "upstream %q is defined twice (first at line %d)", u.Name, prev.Line)
	} else {
		seen[u.Name] = e.at("name")
	}
}

// validateUpstreamLifecycle checks the settings of how u's connections
// are kept, whatever its kind: namespace (count is the number of
// upstreams), lifecycle and warm_spares.
func (l *loader) validateUpstreamLifecycle(e upstreamEntry, u *Upstream, count int) {
	if !u.Namespaced() && count > 1 {
		l.errorf(e.at("namespace"), e.f+".namespace", "remove namespace: false: with more than one upstream every tool is exposed as <upstream>__<tool>",
			"namespace: false is only allowed with a single upstream (there are %d): unprefixed tool names of several upstreams could collide", count)
	}
	switch u.Lifecycle {
	case "", LifecyclePerSession, LifecycleShared:
	default:
		l.errorf(e.at("lifecycle"), e.f+".lifecycle", "", "%q: want per-session or shared", u.Lifecycle)
	}
	switch {
	case u.WarmSpares < 0 || u.WarmSpares > MaxWarmSpares:
		l.errorf(e.at("warm_spares"), e.f+".warm_spares", "", "%d: want 0 (none) to %d", u.WarmSpares, MaxWarmSpares)
	case u.WarmSpares > 0 && u.Shared():
		l.errorf(e.at("warm_spares"), e.f+".warm_spares", "remove warm_spares, or use lifecycle: per-session",
			"a shared upstream has one connection for every session: warm spares are for per-session upstreams")
	case u.WarmSpares > 0 && u.HTTP != nil && u.HTTP.Credential != nil && u.HTTP.Credential.PerIdentity():
		l.errorf(e.at("warm_spares"), e.f+".warm_spares", "remove warm_spares",
			"credentials of source %s are minted for the identity of each session, which a connection made before any session cannot carry", u.HTTP.Credential.Source)
	}
}

// validateUpstreamKind checks that u is exactly one of stdio, http and
// tunnel, and reports whether it is.
func (l *loader) validateUpstreamKind(e upstreamEntry, u *Upstream) bool {
	kinds := 0
	for _, set := range []bool{u.Stdio != nil, u.HTTP != nil, u.Tunnel != nil} {
		if set {
			kinds++
		}
	}
	switch {
	case kinds == 0:
		l.errorf(e.n, e.f, "add a stdio:, an http: or a tunnel: section", "neither stdio, http nor tunnel: say how to reach the upstream")
		return false
	case kinds > 1:
		l.errorf(e.n, e.f, "split it into several upstreams", "more than one of stdio, http and tunnel: an upstream is one of them")
		return false
	}
	return true
}

// validateHTTPUpstream checks an http: upstream and makes its file paths
// absolute (relative to dir).
func (l *loader) validateHTTPUpstream(e upstreamEntry, u *Upstream, dir string) {
	if u.Pin != nil {
		l.errorf(e.at("pin"), e.f+".pin", "pin an HTTP upstream's key with http.tls_pin", "a code pin applies to stdio upstreams only")
	}
	if u.AllowUnmeasured {
		l.errorf(e.at("allow_unmeasured"), e.f+".allow_unmeasured", "", "applies to stdio upstreams only")
	}
	if u.AllowCodeEnv {
		l.errorf(e.at("allow_code_env"), e.f+".allow_code_env", "", "applies to stdio upstreams only")
	}
	h := u.HTTP
	l.validateHTTPURL(e, h)
	if h.BearerTokenEnv != "" && !envNameRE.MatchString(h.BearerTokenEnv) {
		l.errorf(e.in("http", "bearer_token_env"), e.f+".http.bearer_token_env", "", "%q is not a valid environment variable name", h.BearerTokenEnv)
	}
	l.validateHeaders(valueNode(e.n, "http"), e.f, h)
	if h.BearerTokenEnv != "" && h.BearerTokenFile != "" {
		l.errorf(e.in("http", "bearer_token_file"), e.f+".http", "", "set bearer_token_env or bearer_token_file, not both")
	}
	if h.CAFile != "" && !h.TLSPin.IsZero() {
		l.errorf(e.in("http", "ca_file"), e.f+".http.ca_file", "remove ca_file or tls_pin", "has no effect with tls_pin: a pinned key is accepted without a CA chain")
	}
	if h.ConnectTimeout < 0 {
		l.errorf(e.in("http", "connect_timeout"), e.f+".http.connect_timeout", "", "negative duration")
	}
	l.validateCredential(valueNode(e.n, "http"), e.f, u, dir)
	h.CAFile = absPath(dir, h.CAFile)
	h.BearerTokenFile = absPath(dir, h.BearerTokenFile)
	for k, v := range h.HeadersFromFile {
		h.HeadersFromFile[k] = absPath(dir, v)
	}
}

// validateHTTPURL checks an http: upstream's url and what its scheme
// allows: tls_pin and ca_file need https://, and plaintext http:// goes
// to a loopback address unless allow_remote_plaintext says otherwise.
func (l *loader) validateHTTPURL(e upstreamEntry, h *HTTP) {
	pu, err := url.Parse(h.URL)
	switch {
	case h.URL == "":
		l.errorf(e.at("http"), e.f+".http.url", "", "missing: the upstream's MCP endpoint URL")
	case err != nil:
		// Not err itself: *url.Error repeats the url, whose
		// query may hold a secret.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		l.errorf(e.in("http", "url"), e.f+".http.url", "", "%v", err)
	case pu.Scheme != "https" && pu.Scheme != "http" || pu.Host == "":
		l.errorf(e.in("http", "url"), e.f+".http.url", "", "%q: want an http:// or https:// URL with a host", RedactedURL(pu))
	case pu.Scheme == "http" && !h.TLSPin.IsZero():
		l.errorf(e.in("http", "tls_pin"), e.f+".http.tls_pin", "use an https:// URL", "a TLS pin needs https://")
	}
	if err != nil || pu.Scheme != "http" {
		return
	}
	if h.CAFile != "" {
		l.errorf(e.in("http", "ca_file"), e.f+".http.ca_file", "use an https:// URL, or remove ca_file", "a CA file needs https://: plaintext http:// has no certificate to verify")
	}
	if !h.AllowRemotePlaintext && !IsLoopbackHost(pu.Hostname()) {
		l.errorf(e.in("http", "url"), e.f+".http.url",
			"use https:// (pin the server's key with tls_pin), or set allow_remote_plaintext: true to accept an unauthenticated, unencrypted link",
			"plaintext http:// to %s, which is not a loopback address (127.0.0.0/8, ::1 or localhost)", pu.Host)
	}
}

// validateStdioUpstream checks a stdio: upstream (creds: the variables
// holding other upstreams' credentials, see credentialEnv) and makes its
// paths absolute (relative to dir).
func (l *loader) validateStdioUpstream(e upstreamEntry, u *Upstream, dir string, creds map[string]string) {
	s := u.Stdio
	if s.Command == "" {
		l.errorf(e.at("stdio"), e.f+".stdio.command", "", "missing: the program to run")
	}
	l.validateChildEnv(e.n, e.f, u, creds)
	if strings.ContainsRune(s.Command, '/') {
		s.Command = absPath(dir, s.Command)
	}
	s.Dir = absPath(dir, s.Dir)
	switch {
	case u.Pin == nil && !u.AllowUnmeasured:
		l.errorf(e.n, e.f, fmt.Sprintf("run: cmcp spawn-digest -- %s, and paste its pin: section here (or set allow_unmeasured: true to run it as spawn-unmeasured)", s.Command),
			"a stdio upstream needs a pin: the gateway refuses to run unmeasured code")
	case u.Pin != nil && u.AllowUnmeasured:
		l.errorf(e.at("allow_unmeasured"), e.f+".allow_unmeasured", "remove allow_unmeasured or the pin", "has no effect on a pinned upstream")
	case u.Pin != nil:
		l.validatePin(e, u.Pin, dir)
	}
}

// validatePin checks a stdio upstream's pin: and makes its target
// absolute (relative to dir).
func (l *loader) validatePin(e upstreamEntry, p *Pin, dir string) {
	if p.Command.IsZero() {
		l.errorf(e.at("pin"), e.f+".pin.command", "run cmcp spawn-digest to compute it", "missing: the digest of the command file")
	}
	if p.Target != "" && p.TargetDigest.IsZero() {
		l.errorf(e.in("pin", "target"), e.f+".pin.target_digest", "run cmcp spawn-digest --target to compute it", "missing: a target needs its digest")
	}
	if p.Target == "" && !p.TargetDigest.IsZero() {
		l.errorf(e.in("pin", "target_digest"), e.f+".pin.target", "", "missing: a target digest needs its target path")
	}
	p.Target = absPath(dir, p.Target)
}

// validateHeaders checks the header names and sources of an http: section
// (node hn): valid names, each header set once (names are
// case-insensitive), and Authorization not also from bearer_token_*.
func (l *loader) validateHeaders(hn *yaml.Node, f string, h *HTTP) {
	seen := map[string]string{} // canonical name -> the setting that sets it
	if h.BearerTokenEnv != "" || h.BearerTokenFile != "" {
		seen["Authorization"] = "bearer_token_env / bearer_token_file"
	}
	for _, src := range []struct {
		key  string
		m    map[string]string
		what string
	}{{"headers_from_env", h.HeadersFromEnv, "environment variable"}, {"headers_from_file", h.HeadersFromFile, "file"}} {
		m := valueNode(hn, src.key)
		names := make([]string, 0, len(src.m))
		for name := range src.m {
			names = append(names, name)
		}
		sort.Strings(names) // the order of the file, as near as a map allows
		for _, name := range names {
			key := keyNode(m, name)
			if key == nil {
				key = hn
			}
			field := f + ".http." + src.key
			if !ValidHeaderName(name) {
				l.errorf(key, field, "a header name is letters, digits and !#$%&'*+-.^_`|~, e.g. X-Api-Key",
					"%q is not a valid HTTP header name", name)
				continue
			}
			canon := textproto.CanonicalMIMEHeaderKey(name)
			if ProtocolHeader(canon) {
				l.errorf(key, field, "the gateway sets it itself for every request; use headers for credentials and similar",
					"header %s is part of the HTTP or MCP protocol and cannot be configured", canon)
				continue
			}
			if prev, dup := seen[canon]; dup {
				l.errorf(key, field, "set each header once", "header %s is also set by %s", canon, prev)
				continue
			}
			seen[canon] = src.key + "." + name
			v := src.m[name]
			switch {
			case src.key == "headers_from_env" && !envNameRE.MatchString(v):
				l.errorf(valueNode(m, name), field+"."+name, "", "%q is not a valid environment variable name", v)
			case v == "":
				l.errorf(valueNode(m, name), field+"."+name, "", "missing: the %s that holds the header's value", src.what)
			}
		}
	}
}

// protocolHeaders are the headers the gateway's HTTP client and go-sdk set
// for every request to an upstream (MCP's own, Mcp-*, too): configured
// values would break the protocol or the connection.
var protocolHeaders = map[string]bool{
	"Accept": true, "Accept-Encoding": true, "Connection": true, "Content-Encoding": true, "Content-Length": true,
	"Content-Type": true, "Host": true, "Keep-Alive": true, "Last-Event-Id": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// ProtocolHeader reports whether the header name (any case) is one the
// gateway's client sets itself, which configuration may not set.
func ProtocolHeader(name string) bool {
	canon := textproto.CanonicalMIMEHeaderKey(name)
	return protocolHeaders[canon] || strings.HasPrefix(canon, "Mcp-")
}

// ValidHeaderName reports whether name is an HTTP header field name: a
// token of RFC 9110 (section 5.1).
func ValidHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// IsLoopbackHost reports whether host (a URL's host name, without port or
// brackets) is a loopback address or "localhost": a host plaintext http://
// may reach without allow_remote_plaintext. Any other name is refused, as
// where it resolves is not known here.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// absPath makes p absolute relative to dir; "" stays "".
func absPath(dir, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	if dir == "" || dir == "." {
		if a, err := filepath.Abs(p); err == nil {
			return a
		}
		return p
	}
	return filepath.Join(dir, p)
}

// Tunnel configures an upstream whose MCP server runs on remote machines
// that dial in to the gateway's tunnel endpoint (server.listen, path
// TunnelPath) with `cmcp connect`:
//
//	upstreams:
//	  - name: files
//	    tunnel:
//	      tokens:
//	        - sha256: sha256:...     # printf %s "$MACHINE_TOKEN" | sha256sum
//	          machines: [lab-7]      # the machine ids it may register; none: any (a group token)
//	      max_machines: 64
type Tunnel struct {
	Tokens      []TunnelToken `yaml:"tokens" json:"tokens"`
	MaxMachines int           `yaml:"max_machines" json:"max_machines,omitempty"`
}

// TunnelToken is one machine token of a tunnel upstream, stored as its
// SHA-256.
type TunnelToken struct {
	SHA256   digest.Digest `yaml:"sha256" json:"sha256"`
	Machines []string      `yaml:"machines" json:"machines,omitempty"`
}

// TunnelPath is the path of the tunnel endpoint on the gateway's listener.
const TunnelPath = "/tunnel"

// machineIDRE is a machine id without its bound of 64 characters, checked
// apart (a counted repetition compiles to one instruction per count).
var machineIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func (l *loader) validateTunnel(n *yaml.Node, f string, u *Upstream) {
	t := u.Tunnel
	tn := valueNode(n, "tunnel")
	if tn == nil {
		tn = n
	}
	for _, bad := range []struct {
		set bool
		key string
	}{{u.Pin != nil, "pin"}, {u.AllowUnmeasured, "allow_unmeasured"}, {u.AllowCodeEnv, "allow_code_env"}} {
		if bad.set {
			l.errorf(valueNode(n, bad.key), f+"."+bad.key, "the connector pins its server (cmcp connect --pin)", "applies to stdio upstreams only")
		}
	}
	if len(t.Tokens) == 0 {
		l.errorf(tn, f+".tunnel.tokens", `add tokens: [{sha256: ...}]: MACHINE_TOKEN=$(head -c 32 /dev/urandom | base64); printf %s "$MACHINE_TOKEN" | sha256sum`,
			"missing: without a machine token no connector can register")
	}
	seq := valueNode(tn, "tokens")
	for i, tok := range t.Tokens {
		var tokNode *yaml.Node = tn
		if seq != nil && i < len(seq.Content) {
			tokNode = seq.Content[i]
		}
		tf := fmt.Sprintf("%s.tunnel.tokens[%d]", f, i)
		if tok.SHA256.IsZero() {
			l.errorf(tokNode, tf+".sha256", `printf %s "$MACHINE_TOKEN" | sha256sum`, "missing: the SHA-256 of the machine token")
		}
		for _, m := range tok.Machines {
			if len(m) > 64 || !machineIDRE.MatchString(m) {
				at := valueNode(tokNode, "machines")
				if at == nil {
					at = tokNode
				}
				l.errorf(at, tf+".machines", "", "%q is not a machine id: 1 to 64 of [A-Za-z0-9._-], starting with a letter or digit", m)
			}
		}
	}
	if t.MaxMachines < 0 || t.MaxMachines > 10000 {
		at := valueNode(tn, "max_machines")
		if at == nil {
			at = tn
		}
		l.errorf(at, f+".tunnel.max_machines", "", "%d: want 1 to 10000 (0: 64)", t.MaxMachines)
	}
}
