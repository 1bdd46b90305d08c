package config

import (
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

const gwBase = "version: 1\nupstreams:\n  - name: files\n    stdio: {command: /bin/true}\n    allow_unmeasured: true\n"

func TestGatewaySections(t *testing.T) {
	pin := digest.Bytes([]byte("t")).String()
	c, err := LoadBytes("c.yaml", []byte(gwBase+`server:
  listen: 127.0.0.1:9000
  tokens: [{identity: alice, sha256: `+pin+`}]
  session_timeout: 2m
  tee: software
audit: {dir: audit, durability: interval}
catalog:
  drift: warn
  upstreams:
    files: {drift: refuse, tools: {echo: `+pin+`}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.ListenOrDefault() != "127.0.0.1:9000" || c.Server.SessionTimeout != 2*time.Minute || c.Server.Tokens[0].Identity != "alice" {
		t.Fatalf("server: %+v", c.Server)
	}
	if c.DriftWarn("files") || !c.DriftWarn("other") {
		t.Fatal("drift: the per-upstream setting must win over the default")
	}
	if p := c.ToolPins("files"); p["echo"].String() != pin || c.ToolPins("other") != nil {
		t.Fatalf("pins %v", p)
	}
	if (*Server)(nil).ListenOrDefault() != DefaultListen {
		t.Fatal("default listen")
	}
}

// TestSessionBoundsAsLoaded: server.max_sessions and server.max_sessions_per_agent
// as loaded, and their defaults. Unset, the bound per agent is 64 or the
// bound in all, whichever is less: setting only max_sessions below 64 is
// not refused for a bound per agent the operator never wrote (one set
// above the bound in all still is, see TestGatewaySectionErrors).
func TestSessionBoundsAsLoaded(t *testing.T) {
	for _, tc := range []struct {
		name, server    string
		total, perAgent int
	}{
		{"unset", "{}", DefaultMaxSessions, DefaultMaxSessionsPerAgent},
		{"only the total, below the default per agent", "{max_sessions: 16}", 16, 16},
		{"only the total, 1", "{max_sessions: 1}", 1, 1},
		{"only the total, above the default per agent", "{max_sessions: 100}", 100, DefaultMaxSessionsPerAgent},
		{"only per agent", "{max_sessions_per_agent: 10}", DefaultMaxSessions, 10},
		{"both", "{max_sessions: 1000, max_sessions_per_agent: 500}", 1000, 500},
		{"per agent equal to the total", "{max_sessions: 16, max_sessions_per_agent: 16}", 16, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadBytes("c.yaml", []byte(gwBase+"server: "+tc.server+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			if total, per := c.Server.SessionBounds(); total != tc.total || per != tc.perAgent {
				t.Fatalf("session bounds %d in all, %d per agent; want %d, %d", total, per, tc.total, tc.perAgent)
			}
		})
	}
	if total, per := (*Server)(nil).SessionBounds(); total != DefaultMaxSessions || per != DefaultMaxSessionsPerAgent {
		t.Fatalf("no server section: %d, %d", total, per)
	}
}

func TestGatewaySectionErrors(t *testing.T) {
	pin := digest.Bytes([]byte("t")).String()
	for _, tc := range []struct{ name, yaml, want string }{
		{"listen", "server: {listen: nope}", `server.listen "nope"`},
		{"token without digest", "server: {tokens: [{identity: a}]}", "sha256 is required"},
		{"token twice", "server: {tokens: [{identity: a, sha256: " + pin + "}, {identity: b, sha256: " + pin + "}]}", "listed twice"},
		{"bad digest", "server: {tokens: [{identity: a, sha256: abc}]}", "malformed digest"},
		{"tls half", "server: {tls: {cert: a.crt}}", "cert and key are both required"},
		{"tee", "server: {tee: sgx}", `server.tee "sgx"`},
		{"max sessions negative", "server: {max_sessions: -1}", "server.max_sessions -1: want a positive number"},
		{"max sessions per agent negative", "server: {max_sessions_per_agent: -5}", "server.max_sessions_per_agent -5: want a positive number"},
		{"max sessions not a number", "server: {max_sessions: many}", "max_sessions"},
		{"per agent over the default total", "server: {max_sessions_per_agent: 300}", "server.max_sessions_per_agent 300 is more than server.max_sessions (unset: 256)"},
		{"per agent over the total", "server: {max_sessions: 10, max_sessions_per_agent: 11}", "server.max_sessions_per_agent 11 is more than server.max_sessions (10)"},
		{"per agent at its default over the total", "server: {max_sessions: 16, max_sessions_per_agent: 64}", "server.max_sessions_per_agent 64 is more than server.max_sessions (16)"},
		{"audit dir", "audit: {durability: group}", "audit.dir is required"},
		{"durability", "audit: {dir: a, durability: sometimes}", `audit.durability "sometimes"`},
		{"vault", "audit: {dir: a, vault: true}", "needs audit.recipients"},
		{"drift", "catalog: {drift: maybe}", `catalog.drift "maybe"`},
		{"unknown key", "server: {listne: x}", `unknown key "listne"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte(gwBase+tc.yaml+"\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "c.yaml:") {
				t.Fatalf("error does not name the file and line: %v", err)
			}
		})
	}
}

// TestCatalogPinsForUnknownUpstreamRefused: pins under a name that no
// upstream has (a typo: "file" for "files") are refused at load, at the
// entry's line, with a hint naming the configured upstreams; accepted,
// they would leave the real upstream unpinned (first-seen definitions).
func TestCatalogPinsForUnknownUpstreamRefused(t *testing.T) {
	pin := digest.Bytes([]byte("t")).String()
	for _, tc := range []struct{ name, yaml, want, hint string }{
		{"typo", gwBase + "catalog:\n  upstreams:\n    file:\n      tools: {read_file: " + pin + "}\n",
			`c.yaml:8:5: catalog.upstreams.file: no upstream named "file" is configured, so these pins would pin nothing`,
			`did you mean "files"? the configured upstreams are: files`},
		{"no upstreams", "version: 1\ncatalog:\n  upstreams:\n    files:\n      tools: {read_file: " + pin + "}\n",
			`c.yaml:4:5: catalog.upstreams.files: no upstream named "files" is configured`,
			"no upstream is configured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("loaded: pins for an upstream that is not configured were accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error:\n  %v\nwant it to contain:\n  %s", err, tc.want)
			}
			if exitcode.CodeOf(err) != exitcode.ExitConfig || !strings.Contains(strings.Join(exitcode.HintsOf(err), "\n"), tc.hint) {
				t.Fatalf("exit code %d, hints %q: want %d and %q", exitcode.CodeOf(err), exitcode.HintsOf(err), exitcode.ExitConfig, tc.hint)
			}
		})
	}
	// The configured upstream's own entry loads.
	c, err := LoadBytes("c.yaml", []byte(gwBase+"catalog:\n  upstreams:\n    files:\n      tools: {read_file: "+pin+"}\n"))
	if err != nil || c.ToolPins("files")["read_file"].String() != pin {
		t.Fatalf("%v", err)
	}
}

// TestAuditRecipientsParsedAtLoad: audit.recipients are parsed when the
// file is loaded (as the audit log parses them), so a value that is not an
// age recipient is a configuration error at its line, with a hint, and
// never reaches serve (which would create the audit directory first). An
// age identity pasted there by mistake is a secret: it is not repeated.
func TestAuditRecipientsParsedAtLoad(t *testing.T) {
	const good = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
	for _, tc := range []struct{ name, recipients, want, hint, notWant string }{
		{"not a key", "[notakey]", `c.yaml:3:16: audit.recipients[0] "notakey" is not an age recipient`, "an age recipient starts with age1", ""},
		{"second of two", "[" + good + ", age1nope]", `c.yaml:3:80: audit.recipients[1] "age1nope" is not an age recipient`, "age-keygen", ""},
		{"an identity", "[AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ]", "audit.recipients[0] is an age identity (a secret key), not a recipient", "age-keygen -y", "AGE-SECRET-KEY-1QQQ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte("version: 1\naudit:\n  recipients: "+tc.recipients+"\n  dir: a\n"))
			if err == nil {
				t.Fatal("loaded: an invalid recipient was accepted")
			}
			if !strings.Contains(err.Error(), tc.want) || exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Fatalf("error (exit %d):\n  %v\nwant it to contain:\n  %s", exitcode.CodeOf(err), err, tc.want)
			}
			if hs := strings.Join(exitcode.HintsOf(err), "\n"); !strings.Contains(hs, tc.hint) {
				t.Errorf("hints %q do not mention %q", hs, tc.hint)
			}
			if tc.notWant != "" && strings.Contains(err.Error()+strings.Join(exitcode.HintsOf(err), "\n"), tc.notWant) {
				t.Errorf("the error repeats the secret key: %v", err)
			}
		})
	}
	if _, err := LoadBytes("c.yaml", []byte("version: 1\naudit:\n  recipients: ["+good+"]\n  dir: a\n")); err != nil {
		t.Fatalf("a valid recipient: %v", err)
	}
}

// TestCatalogEntryWithoutToolsRefused: a catalog entry whose tools key is
// missing or empty (a PIN_TOOLS placeholder pasted with nothing after it)
// pins nothing; accepted, the upstream ran on whatever definitions it
// showed first, while tools: {} refuses every tool. It is refused at
// load, at its line, with what to write; tools: {} loads and pins no tool.
func TestCatalogEntryWithoutToolsRefused(t *testing.T) {
	for _, tc := range []struct{ name, entry, want string }{
		{"empty entry", "    files: {}\n", "c.yaml:8:5: catalog.upstreams.files: has no tools: key, so it pins nothing"},
		{"entry null", "    files:\n", "c.yaml:8:5: catalog.upstreams.files: has no tools: key, so it pins nothing"},
		{"drift with tools null", "    files:\n      drift: warn\n      tools:\n", "c.yaml:10:7: catalog.upstreams.files.tools: is empty, so it pins nothing"},
		{"tools left empty", "    files:\n      tools:\n", "c.yaml:9:7: catalog.upstreams.files.tools: is empty, so it pins nothing"},
		{"tools null", "    files:\n      tools: null\n", "c.yaml:9:7: catalog.upstreams.files.tools: is empty, so it pins nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte(gwBase+"catalog:\n  upstreams:\n"+tc.entry))
			if err == nil {
				t.Fatal("loaded: a catalog entry without tools would trust the tools first seen")
			}
			if !strings.Contains(err.Error(), tc.want) || exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Fatalf("error (exit %d):\n  %v\nwant it to contain:\n  %s", exitcode.CodeOf(err), err, tc.want)
			}
			hs := strings.Join(exitcode.HintsOf(err), "\n")
			for _, h := range []string{"cmcp spawn-digest --tools", "tools: {}", "remove the entry"} {
				if !strings.Contains(hs, h) {
					t.Errorf("hints %q do not say %q", hs, h)
				}
			}
		})
	}
	c, err := LoadBytes("c.yaml", []byte(gwBase+"catalog:\n  upstreams:\n    files:\n      tools: {}\n"))
	if err != nil {
		t.Fatalf("tools: {}: %v", err)
	}
	if pins := c.ToolPins("files"); pins == nil || len(pins) != 0 {
		t.Fatalf("tools: {} gives pins %v; want an empty, non-nil set (every tool refused)", pins)
	}
	if c, err := LoadBytes("c.yaml", []byte(gwBase)); err != nil || c.ToolPins("files") != nil {
		t.Fatalf("no catalog entry: %v, pins %v", err, c.ToolPins("files"))
	}
}

// TestCatalogDriftOnlyEntryIsFirstSeenBaseline: an entry that sets only
// drift: (no tools key) is how to choose refuse or warn for an upstream
// left unpinned, whose baseline is the definitions it shows first: it
// loads, with no pins and its own drift setting. An entry with neither
// (files: {}, files: with nothing) and one whose tools key is there but
// empty are still refused (TestCatalogEntryWithoutToolsRefused).
func TestCatalogDriftOnlyEntryIsFirstSeenBaseline(t *testing.T) {
	for _, tc := range []struct {
		name, catalog string
		warn          bool
	}{
		{"warn under refuse", "catalog:\n  drift: refuse\n  upstreams:\n    files:\n      drift: warn\n", true},
		{"refuse under warn", "catalog:\n  drift: warn\n  upstreams: {files: {drift: refuse}}\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadBytes("c.yaml", []byte(gwBase+tc.catalog))
			if err != nil {
				t.Fatalf("an entry with only drift: is refused: %v", err)
			}
			if c.ToolPins("files") != nil || c.DriftWarn("files") != tc.warn {
				t.Fatalf("loads as pins %v, drift warn %v; want no pins (first-seen baseline), warn %v", c.ToolPins("files"), c.DriftWarn("files"), tc.warn)
			}
		})
	}
}

// TestAuditWitnessesConfig: audit.log and audit.witnesses are checked when
// the file is loaded, each mistake at its line: a witness without a log
// identity, a note key (0x01) where a cosignature key (0x04) belongs, a
// URL that is not http(s), the same witness twice, a log without key_file.
func TestAuditWitnessesConfig(t *testing.T) {
	const wkey = "w1.example/lw+dfb3ff4d+BNEu0LtVxWpuP4GlDHsZ9uu3jofTmCdUymWF+mUkWcRL"
	const noteKey = "w1.example/lw+4c3cb4d2+AWH5u3HGeBXxEbw6tTQKbVpPbl8OdFGSjVNNb7VHV7qX"
	okLog := "  log: {origin: example.com/gw1, key_file: state/log.key}\n"
	for _, tc := range []struct{ name, audit, want string }{
		{"no log", "  witnesses:\n    - {url: 'http://127.0.0.1:1', key: '" + wkey + "'}\n", "c.yaml:5:5: audit.witnesses needs audit.log"},
		{"note key", okLog + "  witnesses:\n    - {url: 'http://127.0.0.1:1', key: '" + noteKey + "'}\n", "c.yaml:6:40: audit.witnesses[0].key: witness key \"w1.example/lw+4c3cb4d2+AWH5u3HGeBXxEbw6tTQKbVpPbl8OdFGSjVNNb7VHV7qX\" is not an Ed25519 cosignature key"},
		{"url", okLog + "  witnesses:\n    - {url: 'ftp://x', key: '" + wkey + "'}\n", `c.yaml:6:13: audit.witnesses[0].url "ftp://x"`},
		{"twice", okLog + "  witnesses:\n    - {url: 'http://a', key: '" + wkey + "'}\n    - {url: 'http://b', key: '" + wkey + "'}\n", "c.yaml:7:30: audit.witnesses[1] has the key name of audit.witnesses[0]"},
		{"key file", "  log: {origin: example.com/gw1}\n", "c.yaml:4:8: audit.log.key_file is required"},
		{"origin", "  log: {origin: 'a b', key_file: k}\n", `c.yaml:4:17: audit.log.origin "a b"`},
		{"receipts", "  receipts: {}\n", "c.yaml:4:13: audit.receipts.dir is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte("version: 1\naudit:\n  dir: a\n"+tc.audit))
			if err == nil || !strings.Contains(err.Error(), tc.want) || exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Fatalf("error (exit %d):\n  %v\nwant it to contain:\n  %s", exitcode.CodeOf(err), err, tc.want)
			}
		})
	}
	c, err := LoadBytes("c.yaml", []byte("version: 1\naudit:\n  dir: a\n"+okLog+"  witnesses:\n    - {url: 'http://127.0.0.1:1', key: '"+wkey+"', name: w1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Audit.Log.Origin != "example.com/gw1" || len(c.Audit.Witnesses) != 1 || c.Audit.Witnesses[0].Name != "w1" {
		t.Fatalf("loaded %+v", c.Audit)
	}
}
