package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/confidential-mcp/cmcp/internal/sessionbounds"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Server is the `server:` section: the agent-facing MCP endpoint.
//
//	server:
//	  listen: 127.0.0.1:8080        # host:port of the Streamable HTTP endpoint (/mcp)
//	  tokens:                       # bearer tokens, stored as sha256 digests only
//	    - identity: alice
//	      sha256: sha256:...        # printf %s "$TOKEN" | sha256sum
//	  tls:                          # optional; client_ca turns on mutual TLS
//	    cert: tls/server.crt
//	    key: tls/server.key
//	    client_ca: tls/agents.pem   # a verified client certificate's subject is the identity
//	                                # (one with an empty subject, SAN-only, is refused)
//	  stdio_identity: local         # identity of the agent of `cmcp serve --stdio`
//	  session_timeout: 10m          # idle agent sessions end (and their children stop)
//	  call_timeout: 5m              # one forwarded tools/call; also how long writing an answer
//	                                # over HTTP may make no progress (an agent that does not read it)
//	  connect_timeout: 1m           # starting an upstream and its MCP handshake
//	  max_request_bytes: 4194304    # larger requests get 413
//	  max_sessions: 256             # open HTTP sessions in all; past it a new one gets 503
//	  max_sessions_per_agent: 64    # open HTTP sessions of one identity; past it 429
//	                                # (unset: 64, or max_sessions if that is less)
//	  shutdown_grace: 10s           # drain in-flight calls on SIGTERM
//	  child_stop_grace: 5s          # SIGTERM to a child's group, then SIGKILL
//	  tee: auto                     # auto (hardware required), sev-snp, tdx or software (development:
//	                                # unattested); unset: hardware if present, else software with a warning
type Server struct {
	Listen string  `yaml:"listen" json:"listen,omitempty"`
	Tokens []Token `yaml:"tokens" json:"tokens,omitempty"`
	// OAuth accepts OAuth 2.1 access tokens (oauth.go) beside Tokens.
	OAuth           *OAuth        `yaml:"oauth" json:"oauth,omitempty"`
	TLS             *TLS          `yaml:"tls" json:"tls,omitempty"`
	StdioIdentity   string        `yaml:"stdio_identity" json:"stdio_identity,omitempty"`
	SessionTimeout  time.Duration `yaml:"session_timeout" json:"session_timeout,omitempty"`
	CallTimeout     time.Duration `yaml:"call_timeout" json:"call_timeout,omitempty"`
	ConnectTimeout  time.Duration `yaml:"connect_timeout" json:"connect_timeout,omitempty"`
	MaxRequestBytes int64         `yaml:"max_request_bytes" json:"max_request_bytes,omitempty"`
	// MaxSessions and MaxSessionsPerAgent bound the open HTTP sessions, in
	// all and of one identity (0: DefaultMaxSessions, and
	// DefaultMaxSessionsPerAgent or MaxSessions if that is less; see
	// SessionBounds). `serve --stdio` has one session.
	MaxSessions         int           `yaml:"max_sessions" json:"max_sessions,omitempty"`
	MaxSessionsPerAgent int           `yaml:"max_sessions_per_agent" json:"max_sessions_per_agent,omitempty"`
	ShutdownGrace       time.Duration `yaml:"shutdown_grace" json:"shutdown_grace,omitempty"`
	ChildStopGrace      time.Duration `yaml:"child_stop_grace" json:"child_stop_grace,omitempty"`
	TEE                 string        `yaml:"tee" json:"tee,omitempty"`
}

// Token is one accepted bearer token: the digest of the token and the agent
// identity it stands for. The token itself never appears in the file.
type Token struct {
	Identity string        `yaml:"identity" json:"identity"`
	SHA256   digest.Digest `yaml:"sha256" json:"sha256"`
}

// TLS configures HTTPS (and, with ClientCA, mutual TLS) on the MCP endpoint.
// Paths are relative to the configuration file.
type TLS struct {
	Cert     string `yaml:"cert" json:"cert"`
	Key      string `yaml:"key" json:"key"`
	ClientCA string `yaml:"client_ca" json:"client_ca,omitempty"`
}

// DefaultListen is where serve listens when server.listen is not set.
const DefaultListen = "127.0.0.1:8080"

// The bounds on open HTTP sessions when server.max_sessions and
// server.max_sessions_per_agent are not set (unset, the bound per agent is
// never more than the bound in all: see SessionBounds). Every session of a
// per-session upstream holds a child (about 10 MiB and 4 file descriptors
// each for a small server) until it ends, so the bound in all keeps a busy
// gateway within a few GiB and a few thousand descriptors per such
// upstream; one agent may hold a quarter of it, generous for clients that
// open a session per window or task and leave idle ones to the session
// timeout, and still leaving the rest to the others.
const (
	DefaultMaxSessions         = sessionbounds.DefaultTotal
	DefaultMaxSessionsPerAgent = sessionbounds.DefaultPerAgent
)

// SessionBounds returns server.max_sessions and
// server.max_sessions_per_agent, or their defaults. Unset, the bound per
// agent is DefaultMaxSessionsPerAgent or the bound in all, whichever is
// less: an operator who lowers only server.max_sessions has not asked for
// more per agent than in all (Validate refuses that only when both are
// set).
func (s *Server) SessionBounds() (total, perAgent int) {
	if s == nil {
		return sessionbounds.Resolve(0, 0)
	}
	return sessionbounds.Resolve(s.MaxSessions, s.MaxSessionsPerAgent)
}

// Validate checks the server section.
func (s *Server) Validate() error {
	if s.Listen != "" {
		if _, _, err := net.SplitHostPort(s.Listen); err != nil {
			return valueAt("listen").errorf("server.listen %q: want host:port, e.g. %s", s.Listen, DefaultListen)
		}
	}
	seen := map[string]int{}
	for i, t := range s.Tokens {
		if t.Identity == "" {
			return valueAt("tokens", i).errorf("server.tokens[%d]: identity is required", i)
		}
		if strings.ContainsFunc(t.Identity, unicode.IsControl) {
			return valueAt("tokens", i, "identity").errorf("server.tokens[%d]: identity %q holds control characters; use a plain name", i, t.Identity)
		}
		if t.SHA256.IsZero() {
			return valueAt("tokens", i).errorf("server.tokens[%d] (%s): sha256 is required: the digest of the token (printf %%s \"$TOKEN\" | sha256sum)", i, t.Identity)
		}
		if first, dup := seen[t.SHA256.String()]; dup {
			return valueAt("tokens", i, "sha256").errorf("server.tokens[%d] (%s): the same token digest is listed twice (first as server.tokens[%d])", i, t.Identity, first)
		}
		seen[t.SHA256.String()] = i
	}
	if s.OAuth != nil {
		if err := s.OAuth.validate(); err != nil {
			return err
		}
	}
	if s.TLS != nil && (s.TLS.Cert == "" || s.TLS.Key == "") {
		return valueAt("tls").errorf("server.tls: cert and key are both required")
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{
		{"session_timeout", s.SessionTimeout}, {"call_timeout", s.CallTimeout}, {"connect_timeout", s.ConnectTimeout},
		{"shutdown_grace", s.ShutdownGrace}, {"child_stop_grace", s.ChildStopGrace},
	} {
		if d.d < 0 {
			return valueAt(d.name).errorf("server.%s: negative duration", d.name)
		}
	}
	if s.MaxRequestBytes < 0 {
		return valueAt("max_request_bytes").errorf("server.max_request_bytes: negative")
	}
	if s.MaxSessions < 0 {
		return valueAt("max_sessions").errorf("server.max_sessions %d: want a positive number of sessions (unset: %d)", s.MaxSessions, DefaultMaxSessions)
	}
	if s.MaxSessionsPerAgent < 0 {
		return valueAt("max_sessions_per_agent").errorf("server.max_sessions_per_agent %d: want a positive number of sessions (unset: %d, or server.max_sessions if that is less)", s.MaxSessionsPerAgent, DefaultMaxSessionsPerAgent)
	}
	// Only a bound per agent that was set can be over the bound in all.
	if total, per := s.SessionBounds(); s.MaxSessionsPerAgent > 0 && per > total {
		what := fmt.Sprintf("server.max_sessions (%d)", total)
		if s.MaxSessions == 0 {
			what = fmt.Sprintf("server.max_sessions (unset: %d)", total)
		}
		return valueAt("max_sessions_per_agent").errorf("server.max_sessions_per_agent %d is more than %s, so no agent could open that many sessions: raise server.max_sessions too, or lower this", per, what)
	}
	switch s.TEE {
	case "", "auto", "sev-snp", "tdx", "software":
	default:
		return valueAt("tee").errorf("server.tee %q: want auto, sev-snp, tdx or software", s.TEE)
	}
	return nil
}

// ListenOrDefault is Listen or DefaultListen.
func (s *Server) ListenOrDefault() string {
	if s == nil || s.Listen == "" {
		return DefaultListen
	}
	return s.Listen
}

// Audit is the `audit:` section: where and how the audit log is written.
//
//	audit:
//	  dir: audit/                 # relative to the configuration file
//	  durability: group           # strict, group (default) or interval
//	  recipients: [age1...]       # auditors who may open commitments
//	  vault: false                # keep sealed payloads for replay (needs recipients)
//	  log:                        # a stable log identity across restarts (FORMAT.md section 11)
//	    origin: example.com/gw1
//	    key_file: state/log.key   # created at the first start (0600); keep it
//	  witnesses:                  # C2SP witnesses that cosign the log checkpoints (need log)
//	    - url: https://witness.example/
//	      key: witness.example/w+1234abcd+B...   # its cosignature verifier key
//	      name: w1                # optional: for status and logs
//	  receipts:                   # a receipt of every session that ends
//	    dir: receipts/
type Audit struct {
	Dir        string    `yaml:"dir" json:"dir"`
	Durability string    `yaml:"durability" json:"durability,omitempty"`
	Recipients []string  `yaml:"recipients" json:"recipients,omitempty"`
	Vault      bool      `yaml:"vault" json:"vault,omitempty"`
	Log        *AuditLog `yaml:"log" json:"log,omitempty"`
	Witnesses  []Witness `yaml:"witnesses" json:"witnesses,omitempty"`
	Receipts   *Receipts `yaml:"receipts" json:"receipts,omitempty"`
}

// Receipts is audit.receipts: a receipt of every session that ends is
// written to Dir (relative to the configuration file), as
// <epoch>-<session>.receipt.json. Receipts are also served on request by
// the admin listener (GET /admin/receipt?session=ID) without it.
type Receipts struct {
	Dir string `yaml:"dir" json:"dir"`
}

// AuditLog is audit.log: the gateway's stable log identity.
type AuditLog struct {
	Origin  string `yaml:"origin" json:"origin"`
	KeyFile string `yaml:"key_file" json:"key_file"`
}

// Witness is one of audit.witnesses.
type Witness struct {
	Name string `yaml:"name" json:"name,omitempty"`
	URL  string `yaml:"url" json:"url"`
	Key  string `yaml:"key" json:"key"`
}

// Validate checks the audit section.
func (a *Audit) Validate() error {
	if a.Dir == "" {
		return fmt.Errorf("audit.dir is required: the directory the audit log is written to")
	}
	if !slices.Contains([]string{"", "strict", "group", "interval"}, a.Durability) {
		return valueAt("durability").errorf("audit.durability %q: want strict, group or interval", a.Durability)
	}
	// Parsed as the audit log parses them: a value that is not a
	// recipient is this file's mistake, found before serve creates the
	// audit directory.
	for i, r := range a.Recipients {
		if _, err := auditlog.ParseRecipients([]string{r}); err != nil {
			if strings.HasPrefix(strings.ToUpper(strings.TrimSpace(r)), "AGE-SECRET-KEY-") {
				// Never repeat a secret key, in an error or a log.
				return valueAt("recipients", i).hintf("remove it from the file now, and put its public key here instead: age-keygen -y KEYFILE",
					"audit.recipients[%d] is an age identity (a secret key), not a recipient", i)
			}
			return valueAt("recipients", i).hintf("an age recipient starts with age1...: the public key age-keygen prints (age-keygen -y KEYFILE)",
				"audit.recipients[%d] %q is not an age recipient: %s", i, r, ageProblem(err))
		}
	}
	if a.Vault && len(a.Recipients) == 0 {
		return valueAt("vault").errorf("audit.vault needs audit.recipients: the vault is encrypted to them")
	}
	if l := a.Log; l != nil {
		if l.Origin == "" || strings.ContainsAny(l.Origin, " +\t\n") {
			return valueAt("log", "origin").hintf("a stable name for this gateway's log, like example.com/gw1 (no spaces or '+')",
				"audit.log.origin %q: want a non-empty name without spaces or '+'", l.Origin)
		}
		if l.KeyFile == "" {
			return valueAt("log").hintf("a path outside audit.dir, e.g. state/log.key: the gateway creates the key there at its first start",
				"audit.log.key_file is required: the log key must survive restarts")
		}
	}
	if a.Receipts != nil && a.Receipts.Dir == "" {
		return valueAt("receipts").errorf("audit.receipts.dir is required: where the receipt of each session that ends is written")
	}
	seen := map[string]int{}
	for i, w := range a.Witnesses {
		if a.Log == nil {
			return valueAt("witnesses").hintf("add audit.log with an origin and a key_file",
				"audit.witnesses needs audit.log: a witness follows one log origin and key across restarts")
		}
		v, err := c2sp.NewCosignatureVerifier(w.Key)
		if err != nil {
			return valueAt("witnesses", i, "key").hintf("the witness's cosignature verifier key, as it publishes it (litewitness logs it at start: vkey=...)",
				"audit.witnesses[%d].key: %v", i, err)
		}
		if u, err := url.Parse(w.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return valueAt("witnesses", i, "url").errorf("audit.witnesses[%d].url %q: want an http:// or https:// URL (the client posts to URL/add-checkpoint)", i, w.URL)
		}
		id := v.Name()
		if j, ok := seen[id]; ok {
			return valueAt("witnesses", i, "key").errorf("audit.witnesses[%d] has the key name of audit.witnesses[%d] (%s): each witness once", i, j, id)
		}
		seen[id] = i
	}
	return nil
}

// ageProblem is age's message about one recipient, without the "age
// recipients:" and "error at line 1:" that say nothing about this file.
func ageProblem(err error) string {
	if u := errors.Unwrap(err); u != nil {
		err = u
	}
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(msg, "error at line ") {
		msg = after
	}
	return msg
}

// Catalog is the `catalog:` section: tool-definition pins per upstream and
// what to do when a tool drifts from its pin.
//
//	catalog:
//	  drift: refuse               # refuse (default) or warn, for every upstream
//	  upstreams:
//	    files:
//	      drift: warn             # per upstream
//	      tools:                  # from `cmcp spawn-digest --tools`
//	        read_file: sha256:...
//	    web:
//	      drift: warn             # no tools key: unpinned, first-seen baseline
//
// Every name under upstreams must be a configured upstream's: Load refuses
// any other (a misspelt name would leave the real upstream unpinned).
type Catalog struct {
	Drift     string                  `yaml:"drift" json:"drift,omitempty"`
	Upstreams map[string]CatalogEntry `yaml:"upstreams" json:"upstreams,omitempty"`
}

// CatalogEntry holds one upstream's tool pins.
type CatalogEntry struct {
	Drift string                   `yaml:"drift" json:"drift,omitempty"`
	Tools map[string]digest.Digest `yaml:"tools" json:"tools,omitempty"`
}

// Validate checks the catalog section.
func (c *Catalog) Validate() error {
	if c.Drift != "" && c.Drift != "refuse" && c.Drift != "warn" {
		return valueAt("drift").errorf("catalog.drift %q: want refuse or warn", c.Drift)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Upstreams)) {
		e := c.Upstreams[name]
		if e.Drift != "" && e.Drift != "refuse" && e.Drift != "warn" {
			return valueAt("upstreams", name, "drift").errorf("catalog.upstreams.%s.drift %q: want refuse or warn", name, e.Drift)
		}
		for _, tool := range slices.Sorted(maps.Keys(e.Tools)) {
			if e.Tools[tool].IsZero() {
				return valueAt("upstreams", name, "tools", tool).errorf("catalog.upstreams.%s.tools.%s: empty pin", name, tool)
			}
		}
	}
	return nil
}

// DriftWarn reports whether upstream's drifted tools are flagged rather than
// refused.
func (c *Config) DriftWarn(upstream string) bool {
	if c.Catalog == nil {
		return false
	}
	if e, ok := c.Catalog.Upstreams[upstream]; ok && e.Drift != "" {
		return e.Drift == "warn"
	}
	return c.Catalog.Drift == "warn"
}

// ToolPins returns upstream's tool pins, or nil when none are configured.
func (c *Config) ToolPins(upstream string) map[string]digest.Digest {
	if c.Catalog == nil {
		return nil
	}
	e, ok := c.Catalog.Upstreams[upstream]
	if !ok || e.Tools == nil {
		return nil
	}
	return e.Tools
}

// Resolve makes p absolute relative to the configuration file's directory.
func (c *Config) Resolve(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return absPath(filepath.Dir(c.Path), p)
}
