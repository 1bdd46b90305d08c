package config

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
)

const (
	d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

const goodConfig = `# a full example
version: 1
upstreams:
  - name: files
    stdio:
      command: cmcp-sample-server
      args: [--root, /srv]
      env: {LOG_LEVEL: info}
      env_allow: [PATH, HOME]
    pin:
      command: ` + d1 + `
      target: ./server
      target_digest: ` + d2 + `
    lifecycle: shared
  - name: scratch-pad
    stdio:
      command: ./bin/tool
    allow_unmeasured: true
    namespace: true # false only with a single upstream: TestNamespaceFalseNeedsASingleUpstream
  - name: remote_1
    http:
      url: https://mcp.example.com/mcp
      tls_pin: ` + d1 + `
      bearer_token_env: REMOTE_TOKEN
      connect_timeout: 5s
`

func TestLoadGood(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "cmcp.yaml")
	os.WriteFile(p, []byte(goodConfig), 0o644)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Upstreams) != 3 || c.Path != p {
		t.Fatalf("loaded %+v", c)
	}
	f := c.Upstream("files")
	if f.Pin.Command.String() != d1 || f.Pin.TargetDigest.String() != d2 || f.Pin.Target != filepath.Join(dir, "server") {
		t.Errorf("pin %+v", f.Pin)
	}
	if !f.Shared() || !f.Namespaced() || f.Stdio.Command != "cmcp-sample-server" || f.Stdio.Env["LOG_LEVEL"] != "info" {
		t.Errorf("files %+v %+v", f, f.Stdio)
	}
	s := c.Upstream("scratch-pad")
	if s.Stdio.Command != filepath.Join(dir, "bin/tool") || !s.Namespaced() || s.Shared() {
		t.Errorf("scratch-pad %+v %+v", s, s.Stdio)
	}
	r := c.Upstream("remote_1")
	if r.HTTP.TLSPin.String() != d1 || r.HTTP.ConnectTimeout.Seconds() != 5 {
		t.Errorf("remote %+v", r.HTTP)
	}
}

func TestLoadErrors(t *testing.T) {
	up := func(s string) string { return "version: 1\nupstreams:\n" + s }
	tests := []struct {
		name, yaml string
		want       string // substring of the error, with file:line:col
		hint       string
	}{
		{"empty", "", "c.yaml: the configuration is empty", "version: 1"},
		{"syntax", "version: 1\nupstreams: [\n", "c.yaml:2: invalid YAML", ""},
		{"two documents", "version: 1\n---\nversion: 1\n", "c.yaml:2:1: a second YAML document", ""},
		{"not a mapping", "- a\n", "c.yaml:1:1: the configuration must be a mapping", ""},
		{"missing version", "upstreams: []\n", "c.yaml:1:1: version: missing", "version: 1"},
		{"wrong version", "version: 2\n", "c.yaml:1:10: version: unsupported schema version 2", ""},
		{"unknown top-level key", "version: 1\nupstream: []\n", `c.yaml:2:1: unknown key "upstream" at the top level`, `did you mean "upstreams"`},
		{"unknown nested key", up("  - name: a\n    stdio:\n      comand: x\n"), `c.yaml:5:7: unknown key "comand" in upstreams[0].stdio`, `did you mean "command"`},
		{"duplicate key", up("  - name: a\n    name: b\n"), "c.yaml:4:5: upstreams[0].name: duplicate key (first at line 3)", ""},
		{"merge key", "version: 1\nserver:\n  <<: {tee: software}\n", "c.yaml:3:3: server: YAML merge keys (<<) are not accepted", "write the settings out"},
		{"anchor", "version: 1\nbase: &b {x: 1}\n", "c.yaml:2:7: YAML anchors (&b) are not accepted", "write the values out in full"},
		{"alias", "version: 1\nserver:\n  tee: &t software\n  stdio_identity: *t\n", "c.yaml:4:19: YAML aliases (*t) are not accepted", "write the values out in full"},
		{"wrong type", "version: one\n", "c.yaml:1:10: version: cannot unmarshal !!str `one` into int", ""},
		{"list instead of map", up("  - name: a\n    stdio: [x]\n"), "c.yaml:4:12: upstreams[0].stdio: want a mapping of settings, got a list", ""},
		{"malformed digest", up("  - name: a\n    stdio: {command: x}\n    pin: {command: sha256:abc}\n"), `c.yaml:5:20: upstreams[0].pin.command: malformed digest "sha256:abc"`, ""},
		{"bad name", up("  - name: a.b\n    stdio: {command: x}\n    allow_unmeasured: true\n"), `c.yaml:3:11: upstreams[0] (a.b).name: name "a.b": use only letters`, ""},
		{"double underscore", up("  - name: a__b\n    stdio: {command: x}\n    allow_unmeasured: true\n"), `contains "__"`, ""},
		{"long name", up("  - name: " + strings.Repeat("a", 33) + "\n    stdio: {command: x}\n    allow_unmeasured: true\n"), "is 33 characters; at most 32", ""},
		{"duplicate name", up("  - name: a\n    stdio: {command: x}\n    allow_unmeasured: true\n  - name: a\n    stdio: {command: y}\n    allow_unmeasured: true\n"), `c.yaml:6:11: upstreams[1] (a).name: upstream "a" is defined twice (first at line 3)`, ""},
		{"unpinned stdio", up("  - name: a\n    stdio: {command: x}\n"), "c.yaml:3:5: upstreams[0] (a): a stdio upstream needs a pin", "cmcp spawn-digest -- x"},
		{"pin and allow_unmeasured", up("  - name: a\n    stdio: {command: x}\n    pin: {command: " + d1 + "}\n    allow_unmeasured: true\n"), "c.yaml:6:23: upstreams[0] (a).allow_unmeasured: has no effect on a pinned upstream", ""},
		{"target without digest", up("  - name: a\n    stdio: {command: x}\n    pin: {command: " + d1 + ", target: ./t}\n"), "upstreams[0] (a).pin.target_digest: missing", ""},
		{"neither stdio nor http", up("  - name: a\n"), "c.yaml:3:5: upstreams[0] (a): neither stdio, http nor tunnel", ""},
		{"both", up("  - name: a\n    stdio: {command: x}\n    http: {url: https://x}\n"), "more than one of stdio, http and tunnel", ""},
		{"tunnel without tokens", up("  - name: a\n    tunnel: {}\n"), "c.yaml:4:13: upstreams[0] (a).tunnel.tokens: missing: without a machine token no connector can register", ""},
		{"tunnel bad machine id", up("  - name: a\n    tunnel:\n      tokens:\n        - sha256: " + d1 + "\n          machines: [../x]\n"), `c.yaml:7:21: upstreams[0] (a).tunnel.tokens[0].machines: "../x" is not a machine id`, ""},
		{"tunnel token without digest", up("  - name: a\n    tunnel:\n      tokens:\n        - machines: [m]\n"), "upstreams[0] (a).tunnel.tokens[0].sha256: missing", ""},
		{"tunnel with a pin", up("  - name: a\n    tunnel: {tokens: [{sha256: " + d1 + "}]}\n    pin: {command: " + d1 + "}\n"), "upstreams[0] (a).pin: applies to stdio upstreams only", ""},
		{"tunnel and stdio", up("  - name: a\n    stdio: {command: x}\n    tunnel: {tokens: [{sha256: " + d1 + "}]}\n"), "more than one of stdio, http and tunnel", ""},
		{"bad lifecycle", up("  - name: a\n    stdio: {command: x}\n    allow_unmeasured: true\n    lifecycle: forever\n"), `c.yaml:6:16: upstreams[0] (a).lifecycle: "forever": want per-session or shared`, ""},
		{"warm spares out of range", up("  - name: a\n    stdio: {command: x}\n    allow_unmeasured: true\n    warm_spares: 17\n"), `c.yaml:6:18: upstreams[0] (a).warm_spares: 17: want 0 (none) to 16`, ""},
		{"warm spares of a shared upstream", up("  - name: a\n    stdio: {command: x}\n    allow_unmeasured: true\n    lifecycle: shared\n    warm_spares: 2\n"), `upstreams[0] (a).warm_spares: a shared upstream has one connection for every session`, "lifecycle: per-session"},
		{"warm spares with a per-identity credential", up("  - name: a\n    http:\n      url: https://x\n      credential: {source: exec, exec: {command: /bin/true}}\n    warm_spares: 1\n"), `upstreams[0] (a).warm_spares: credentials of source exec are minted for the identity of each session`, "remove warm_spares"},
		{"bad url", up("  - name: a\n    http: {url: ftp://x}\n"), `want an http:// or https:// URL`, ""},
		{"pin on http", up("  - name: a\n    http: {url: https://x}\n    pin: {command: " + d1 + "}\n"), "a code pin applies to stdio upstreams only", ""},
		{"tls pin on http://", up("  - name: a\n    http: {url: http://x, tls_pin: " + d1 + "}\n"), "a TLS pin needs https://", ""},
		{"bad env name", up("  - name: a\n    stdio: {command: x, env_allow: [OK, 'BAD-NAME']}\n    allow_unmeasured: true\n"), `c.yaml:4:41: upstreams[0] (a).stdio.env_allow[1]: "BAD-NAME" is not a valid`, ""},
		// A child's environment: nothing that loads code unless
		// allow_code_env, no other upstream's credential, no CMCP_*.
		{"code-loading env_allow", up("  - name: a\n    stdio: {command: x, env_allow: [PATH, HOME, PYTHONPATH]}\n    pin: {command: " + d1 + "}\n"),
			"c.yaml:4:49: upstreams[0] (a).stdio.env_allow[2]: PYTHONPATH, copied from the gateway's environment, loads code the pin does not cover: python imports modules from the directories it lists before its own", "allow_code_env: true"},
		{"code-loading env", up("  - name: a\n    stdio:\n      command: x\n      env:\n        LOG: info\n        LD_PRELOAD: /tmp/x.so\n    pin: {command: " + d1 + "}\n"),
			"c.yaml:8:9: upstreams[0] (a).stdio.env.LD_PRELOAD: LD_PRELOAD loads code the pin does not cover: the dynamic loader loads the libraries it names", "spawn-unmeasured"},
		{"any LD_ variable", up("  - name: a\n    stdio: {command: x, env_allow: [LD_AUDIT]}\n    allow_unmeasured: true\n"), "env_allow[0]: LD_AUDIT, copied from the gateway's environment, loads code", ""},
		{"npm settings in any case", up("  - name: a\n    stdio: {command: x, env: {NPM_CONFIG_REGISTRY: 'https://evil'}}\n    allow_unmeasured: true\n"), "stdio.env.NPM_CONFIG_REGISTRY: NPM_CONFIG_REGISTRY loads code", ""},
		{"allow_code_env without a code variable", up("  - name: a\n    stdio: {command: x, env_allow: [PATH]}\n    pin: {command: " + d1 + "}\n    allow_code_env: true\n"),
			"c.yaml:6:21: upstreams[0] (a).allow_code_env: has no effect: neither stdio.env nor stdio.env_allow names a variable that loads code", ""},
		{"allow_code_env on http", up("  - name: a\n    http: {url: https://x}\n    allow_code_env: true\n"), "c.yaml:5:21: upstreams[0] (a).allow_code_env: applies to stdio upstreams only", ""},
		{"bearer token in env_allow", up("  - name: a\n    stdio: {command: x, env_allow: [PATH, UPSTREAM_TOKEN]}\n    pin: {command: " + d1 + "}\n  - name: remote\n    http: {url: https://x, bearer_token_env: UPSTREAM_TOKEN}\n"),
			"c.yaml:4:43: upstreams[0] (a).stdio.env_allow[1]: UPSTREAM_TOKEN holds the credential of another upstream (upstreams[1] (remote).http.bearer_token_env): the child would get that secret", "a variable of its own"},
		{"header credential in env_allow", up("  - name: remote\n    http:\n      url: https://x\n      headers_from_env: {X-Api-Key: API_KEY}\n  - name: a\n    stdio: {command: x, env_allow: [API_KEY]}\n    allow_unmeasured: true\n"),
			"c.yaml:8:37: upstreams[1] (a).stdio.env_allow[0]: API_KEY holds the credential of another upstream (upstreams[0] (remote).http.headers_from_env.X-Api-Key)", ""},
		{"CMCP_ in env_allow", up("  - name: a\n    stdio: {command: x, env_allow: [PATH, CMCP_REAPER]}\n    allow_unmeasured: true\n"),
			"c.yaml:4:43: upstreams[0] (a).stdio.env_allow[1]: CMCP_REAPER: CMCP_* variables are the gateway's own, never copied to a child", "stdio.env"},
		{"bad name in env", up("  - name: a\n    stdio: {command: x, env: {'A-B': x}}\n    allow_unmeasured: true\n"), `c.yaml:4:31: upstreams[0] (a).stdio.env: "A-B" is not a valid`, ""},
		{"bool typo", up("  - name: a\n    stdio: {command: x}\n    allow_unmeasured: yes\n"), `c.yaml:5:23: upstreams[0].allow_unmeasured: "yes": want true or false`, ""},
		{"bad duration", up("  - name: a\n    http: {url: https://x, connect_timeout: soon}\n"), "upstreams[0].http.connect_timeout", ""},
		{"remote plaintext address", up("  - name: a\n    http:\n      url: http://10.0.0.1/mcp\n"),
			"c.yaml:5:12: upstreams[0] (a).http.url: plaintext http:// to 10.0.0.1, which is not a loopback address", "allow_remote_plaintext: true"},
		{"remote plaintext name", up("  - name: a\n    http:\n      url: http://mcp.internal:8080/mcp\n"),
			"c.yaml:5:12: upstreams[0] (a).http.url: plaintext http:// to mcp.internal:8080, which is not a loopback address", "allow_remote_plaintext: true"},
		{"ca_file on http://", up("  - name: a\n    http:\n      url: http://127.0.0.1:9/mcp\n      ca_file: ca.pem\n"),
			"c.yaml:6:16: upstreams[0] (a).http.ca_file: a CA file needs https://", "use an https:// URL"},
		{"bad header name", up("  - name: a\n    http:\n      url: https://x/mcp\n      headers_from_env: {'Bad Header': KEY}\n"),
			`c.yaml:6:26: upstreams[0] (a).http.headers_from_env: "Bad Header" is not a valid HTTP header name`, "X-Api-Key"},
		{"bad header name in a file", up("  - name: a\n    http:\n      url: https://x/mcp\n      headers_from_file:\n        'X-Key:': key.txt\n"),
			`c.yaml:7:9: upstreams[0] (a).http.headers_from_file: "X-Key:" is not a valid HTTP header name`, ""},
		{"protocol header", up("  - name: a\n    http:\n      url: https://x/mcp\n      headers_from_env: {content-type: KEY}\n"),
			"c.yaml:6:26: upstreams[0] (a).http.headers_from_env: header Content-Type is part of the HTTP or MCP protocol and cannot be configured", "sets it itself"},
		{"MCP header", up("  - name: a\n    http:\n      url: https://x/mcp\n      headers_from_file: {Mcp-Session-Id: sid.txt}\n"),
			"c.yaml:6:27: upstreams[0] (a).http.headers_from_file: header Mcp-Session-Id is part of the HTTP or MCP protocol and cannot be configured", ""},
		{"header twice", up("  - name: a\n    http:\n      url: https://x/mcp\n      headers_from_env: {X-Key: KEY}\n      headers_from_file: {x-key: key.txt}\n"),
			"c.yaml:7:27: upstreams[0] (a).http.headers_from_file: header X-Key is also set by headers_from_env.X-Key", "set each header once"},
		{"authorization twice", up("  - name: a\n    http:\n      url: https://x/mcp\n      bearer_token_env: TOKEN\n      headers_from_env: {authorization: KEY}\n"),
			"c.yaml:7:26: upstreams[0] (a).http.headers_from_env: header Authorization is also set by bearer_token_env / bearer_token_file", ""},
		{"header env name", up("  - name: a\n    http:\n      url: https://x/mcp\n      headers_from_env: {X-Key: 'MY-KEY'}\n"),
			`c.yaml:6:33: upstreams[0] (a).http.headers_from_env.X-Key: "MY-KEY" is not a valid environment variable name`, ""},
		{"bearer env name", up("  - name: a\n    http:\n      url: https://x/mcp\n      bearer_token_env: 'MY TOKEN'\n"),
			`c.yaml:6:25: upstreams[0] (a).http.bearer_token_env: "MY TOKEN" is not a valid environment variable name`, ""},
		// A section's own checks name the line of the offending value.
		{"identity with a control character", "version: 1\nserver:\n  tokens:\n    - identity: \"bob\\0ops\"\n      sha256: " + d1 + "\n",
			`c.yaml:4:17: server.tokens[0]: identity "bob\x00ops" holds control characters; use a plain name`, ""},
		{"token twice", "version: 1\nserver:\n  tokens:\n    - identity: a\n      sha256: " + d1 + "\n    - identity: b\n      sha256: " + d1 + "\n",
			"c.yaml:7:15: server.tokens[1] (b): the same token digest is listed twice (first as server.tokens[0])", ""},
		{"token without digest", "version: 1\nserver:\n  tokens:\n    - {identity: a, sha256: " + d1 + "}\n    - identity: b\n",
			"c.yaml:5:7: server.tokens[1] (b): sha256 is required", ""},
		{"tee", "version: 1\nserver:\n  listen: 127.0.0.1:9000\n  tee: sgx\n", `c.yaml:4:8: server.tee "sgx": want auto`, ""},
		{"session_timeout", "version: 1\nserver:\n  tee: software\n  session_timeout: -5s\n", "c.yaml:4:20: server.session_timeout: negative duration", ""},
		{"tls half", "version: 1\nserver:\n  tee: software\n  tls:\n    cert: a.crt\n", "c.yaml:5:5: server.tls: cert and key are both required", ""},
		{"durability", "version: 1\naudit:\n  dir: a\n  durability: sometimes\n", `c.yaml:4:15: audit.durability "sometimes"`, ""},
		{"vault", "version: 1\naudit:\n  dir: a\n  vault: true\n", "c.yaml:4:10: audit.vault needs audit.recipients", ""},
		{"audit dir", "version: 1\naudit:\n  vault: false\n", "c.yaml:2:1: audit.dir is required", ""},
		{"catalog drift", "version: 1\ncatalog:\n  drift: warn\n  upstreams:\n    files:\n      drift: maybe\n", `c.yaml:6:14: catalog.upstreams.files.drift "maybe"`, ""},
		{"admin listen", "version: 1\nadmin:\n  token_sha256: " + d1 + "\n  listen: 9090\n", `c.yaml:4:11: admin.listen "9090": want host:port`, ""},
		{"policy mode", "version: 1\npolicy:\n  dir: p\n  mode: permissive\n", `c.yaml:4:9: policy.mode "permissive"`, ""},
		{"policy member twice", "version: 1\npolicy:\n  dir: p\n  groups:\n    ops: [a, b, a]\n", `c.yaml:5:17: policy.groups.ops: agent "a" listed twice`, ""},
		{"policy group name", "version: 1\npolicy:\n  dir: p\n  groups:\n    ops: [a]\n    'o\"ps': [b]\n", `c.yaml:6:5: policy.groups: group name "o\"ps"`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatal("loaded, want an error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error:\n  %v\nwant it to contain:\n  %s", err, tt.want)
			}
			if exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Errorf("exit code %d, want %d", exitcode.CodeOf(err), exitcode.ExitConfig)
			}
			if tt.hint != "" && !strings.Contains(strings.Join(exitcode.HintsOf(err), "\n"), tt.hint) {
				t.Errorf("hints %q do not mention %q", exitcode.HintsOf(err), tt.hint)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Errorf("errors.As(*Error) failed for %T", err)
			}
		})
	}
}

// TestLoadChildEnv: what a stdio child's environment may hold. A
// code-loading variable loads with allow_code_env; a literal value in env
// may use any name (it is no secret of the gateway's: env: {TOKEN: x} sets
// the child's own variable, and tests set CMCP_TEST_* so); variables that
// load no code load as they are.
func TestLoadChildEnv(t *testing.T) {
	c, err := LoadBytes("c.yaml", []byte(`version: 1
upstreams:
  - name: py
    stdio:
      command: /usr/bin/python3
      env_allow: [PATH, HOME, PYTHONPATH]
      env: {PYTHONUNBUFFERED: "1", PYTHONNOUSERSITE: "1", PYTHONPYCACHEPREFIX: /var/cache/py, REMOTE_TOKEN: literal, CMCP_TEST_CHILD: server}
    pin: {command: `+d1+`}
    allow_code_env: true
  - name: remote
    http: {url: https://x, bearer_token_env: REMOTE_TOKEN}
`))
	if err != nil {
		t.Fatal(err)
	}
	if u := c.Upstream("py"); !u.AllowCodeEnv {
		t.Errorf("allow_code_env not loaded: %+v", u)
	}
}

// TestCodeLoadingEnv: the variables that make a program load code are
// known, with a reason; ordinary ones are not.
func TestCodeLoadingEnv(t *testing.T) {
	for _, name := range []string{"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_BIND_NOW", "DYLD_INSERT_LIBRARIES", "GCONV_PATH",
		"NODE_OPTIONS", "NODE_PATH", "npm_config_registry", "NPM_CONFIG_NODE_OPTIONS",
		"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONBREAKPOINT", "PYTHONWARNINGS", "PYTHONPYCACHEPREFIX",
		"PERL5LIB", "PERLLIB", "PERL5OPT", "PERL5DB", "RUBYOPT", "RUBYLIB", "GEM_PATH", "BUNDLE_GEMFILE",
		"BASH_ENV", "ENV", "SHELLOPTS", "PS4", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH",
		"DOTNET_STARTUP_HOOKS", "CORECLR_PROFILER_PATH_64", "LUA_INIT", "LUA_PATH_5_4", "PHPRC", "OPENSSL_CONF"} {
		if CodeLoadingEnv(name) == "" {
			t.Errorf("%s: not known to load code", name)
		}
	}
	for _, name := range []string{"PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONUNBUFFERED", "PYTHONNOUSERSITE",
		"PYTHONDONTWRITEBYTECODE", "NODE_ENV", "LOG_LEVEL", "LDFLAGS", "ENVIRONMENT", "npm_package_name"} {
		if why := CodeLoadingEnv(name); why != "" {
			t.Errorf("%s: said to load code (%s)", name, why)
		}
	}
}

// TestLoadSyntaxErrorPositions: a YAML syntax error is reported at the line
// where the file stops being YAML, with no made-up column (yaml.v3's own
// "line N" is the enclosing list's, counted from 0, or missing); a byte YAML
// does not allow is reported at its line and column.
func TestLoadSyntaxErrorPositions(t *testing.T) {
	for _, tt := range []struct{ yaml, want string }{
		// The reviewer's badyaml.yaml: yaml.v3 says "line 2".
		{"version: 1\nupstreams:\n  - name: x\n   stdio: {command: ls}\n", "c.yaml:4: invalid YAML: did not find expected '-' indicator"},
		{"version: 1\nupstreams:\n  - name: a\n    stdio:\n      command: x\n     args: [a]\n", "c.yaml:6: invalid YAML: did not find expected key"},
		{"version: 1\nserver:\n  listen: x\n  tee: a: b\n", "c.yaml:4: invalid YAML: mapping values are not allowed in this context"},
		{"version: a: b\n", "c.yaml:1: invalid YAML: mapping values are not allowed in this context"}, // yaml.v3: no line
		{"version: 1\nserver:\n\ttee: software\n", "c.yaml:3:1: invalid YAML: found character that cannot start any token (a tab)"},
		{"version: 1\n---\nx: [\n", "c.yaml:3: invalid YAML: did not find expected node content"},
		{"version: 1\nserver: {tee: \"soft\x00ware\"}\n", "c.yaml:2:20: invalid YAML: control characters are not allowed (U+0000)"},
		{"version: 1\n# é\nserver: {tee: \x1b}\n", "c.yaml:3:15: invalid YAML: control characters are not allowed (U+001B)"},
		{"version: 1\nserver: {tee: \xff}\n", "c.yaml:2:15: invalid YAML: invalid leading UTF-8 octet (byte 0xff)"},
	} {
		_, err := LoadBytes("c.yaml", []byte(tt.yaml))
		if err == nil || err.Error() != tt.want {
			t.Errorf("%q:\n  got  %v\n  want %s", tt.yaml, err, tt.want)
		}
	}
}

// TestLoadErrorsSayWhatToDo: mistakes whose message alone (yaml.v3's, or
// a parser's) does not tell the operator what to write get a hint: a
// duration without a unit, a tab in the indentation (at its column), and a
// digest pasted as sha256sum prints it.
func TestLoadErrorsSayWhatToDo(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	for _, tt := range []struct{ name, yaml, want, hint string }{
		{"duration without a unit", "version: 1\nserver:\n  call_timeout: 5\n",
			"c.yaml:3:17: server.call_timeout: cannot unmarshal !!int `5` into time.Duration", "a duration with a unit, e.g. 30s or 5m"},
		{"nested duration without a unit", "version: 1\nupstreams:\n  - name: a\n    http: {url: 'https://x', connect_timeout: 10}\n",
			"upstreams[0].http.connect_timeout", "a duration with a unit, e.g. 30s or 5m"},
		{"tab in the indentation", "version: 1\nserver:\n  tee: software\n \tlisten: 127.0.0.1:1\n",
			"c.yaml:4:2: invalid YAML: found a tab character that violates indentation", "YAML indentation must use spaces, not tabs"},
		{"tab as the indentation", "version: 1\nserver:\n\ttee: software\n",
			"c.yaml:3:1: invalid YAML: found character that cannot start any token (a tab)", "YAML indentation must use spaces, not tabs"},
		{"sha256sum output", "version: 1\nserver:\n  tokens:\n    - identity: a\n      sha256: \"" + hex + "  -\"\n",
			"c.yaml:5:15: server.tokens[0].sha256: malformed digest", "drop the trailing \"  -\" (the file name sha256sum prints) and write sha256:" + hex},
		{"sha256sum output of a file", "version: 1\nupstreams:\n  - name: a\n    stdio: {command: x}\n    pin: {command: '" + hex + "  ./server'}\n",
			"upstreams[0].pin.command: malformed digest", "drop the trailing \"  ./server\" (the file name sha256sum prints) and write sha256:" + hex},
		{"bare hex", "version: 1\nadmin:\n  token_sha256: " + hex + "\n",
			"admin.token_sha256: malformed digest", "write sha256:" + hex},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatal("loaded, want an error")
			}
			if !strings.Contains(err.Error(), tt.want) || exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Fatalf("error (exit %d):\n  %v\nwant it to contain:\n  %s", exitcode.CodeOf(err), err, tt.want)
			}
			if hs := strings.Join(exitcode.HintsOf(err), "\n"); !strings.Contains(hs, tt.hint) {
				t.Fatalf("hints %q do not say %q", hs, tt.hint)
			}
		})
	}
}

// TestLoadPlaintextHTTP: http:// loads to a loopback address or localhost,
// and elsewhere only with allow_remote_plaintext.
func TestLoadPlaintextHTTP(t *testing.T) {
	for _, h := range []string{
		"{url: 'http://127.0.0.1:9/mcp'}",
		"{url: 'http://127.3.2.1/mcp'}",
		"{url: 'http://[::1]:9/mcp'}",
		"{url: 'http://LocalHost:9/mcp'}",
		"{url: 'http://10.0.0.1/mcp', allow_remote_plaintext: true}",
		"{url: 'http://mcp.internal/mcp', allow_remote_plaintext: true}",
	} {
		if _, err := LoadBytes("c.yaml", []byte("version: 1\nupstreams:\n  - name: a\n    http: "+h+"\n")); err != nil {
			t.Errorf("%s: %v", h, err)
		}
	}
}

// TestLoadRefusesAliasesBeforeExpanding: a file that aliases one anchored
// upstream thousands of times is refused at the anchor, in time linear in
// its size; following each alias made loading it quadratic (a 27 KB file
// took seconds, a 90 KB one minutes).
func TestLoadRefusesAliasesBeforeExpanding(t *testing.T) {
	const n = 3000
	doc := "version: 1\nupstreams:\n  - &U\n    name: x\n    allow_unmeasured: true\n    stdio: {command: ls, args: [" +
		strings.TrimSuffix(strings.Repeat("a,", n), ",") + "]}\n" + strings.Repeat("  - *U\n", n)
	start := time.Now()
	_, err := LoadBytes("alias.yaml", []byte(doc))
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("loading a %d-byte file of aliases took %v", len(doc), d)
	}
	if err == nil || !strings.HasPrefix(err.Error(), "20 problems") || !strings.Contains(err.Error(), "alias.yaml:3:5: YAML anchors (&U) are not accepted") ||
		!strings.Contains(err.Error(), "alias.yaml:8:5: YAML aliases (*U) are not accepted") {
		t.Fatalf("err = %v", err)
	}
}

func TestLoadReportsEveryProblem(t *testing.T) {
	_, err := LoadBytes("c.yaml", []byte("version: 1\nfoo: 1\nbar: 2\n"))
	var es Errors
	if !errors.As(err, &es) || len(es) != 2 || !strings.Contains(err.Error(), "2 problems") {
		t.Fatalf("err = %v", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if exitcode.CodeOf(err) != exitcode.ExitIO || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v (code %d)", err, exitcode.CodeOf(err))
	}
}

func FuzzLoad(f *testing.F) {
	f.Add([]byte(goodConfig))
	f.Add([]byte("version: 1\nupstreams:\n  - name: a\n    stdio: {command: x}\n"))
	f.Add([]byte("version: 1\npolicy: {dir: p, mode: advisory, groups: {ops: [a]}}\n"))
	f.Add([]byte("version: 1\nx: &a [*a]\n"))
	f.Add([]byte("version: 1\nupstreams: [{name: a, http: {url: 'https://h', headers_from_env: {X-Key: K}}}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := LoadBytes("f.yaml", data)
		if err != nil {
			if c != nil {
				t.Fatal("config returned with an error")
			}
			if !strings.HasPrefix(err.Error(), "f.yaml") && !strings.Contains(err.Error(), "problems in the configuration") {
				t.Fatalf("error does not name the file: %v", err)
			}
			if exitcode.CodeOf(err) != exitcode.ExitConfig {
				t.Fatalf("exit code %d for %v", exitcode.CodeOf(err), err)
			}
			return
		}
		if c.Version != Version {
			t.Fatalf("loaded version %d", c.Version)
		}
		for _, u := range c.Upstreams {
			if ValidateName(u.Name) != nil || (u.Stdio == nil) == (u.HTTP == nil) {
				t.Fatalf("invalid upstream loaded: %+v", u)
			}
		}
	})
}

// TestLoadURLQueryNotInErrors: the query of an upstream's url may hold a
// secret; an error about the url shows it without the query.
func TestLoadURLQueryNotInErrors(t *testing.T) {
	for _, url := range []string{"http://127.0.0.1:port/mcp?api_key=SUPERSECRET", "ftp://h/mcp?api_key=SUPERSECRET"} {
		_, err := LoadBytes("c.yaml", []byte("version: 1\nupstreams:\n  - name: a\n    http: {url: '"+url+"'}\n"))
		if err == nil || !strings.Contains(err.Error(), "c.yaml:4:") || strings.Contains(err.Error(), "SUPERSECRET") {
			t.Errorf("%s: err = %v, want c.yaml:4: and no query", url, err)
		}
	}
}

// TestLoadFileBound: a configuration file over MaxFileBytes is refused
// before it is read whole (a 100 MB file used to be read, then parsed,
// taking 500 MB); one of exactly MaxFileBytes loads.
func TestLoadFileBound(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(100 << 20); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	f.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = Load(big)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "big.yaml: the file is 104857600 bytes; a configuration is at most 1048576 bytes (1 MiB)") || exitcode.CodeOf(err) != exitcode.ExitConfig {
		t.Fatalf("100 MB file: %v (exit %d)", err, exitcode.CodeOf(err))
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 4<<20 {
		t.Errorf("refusing a 100 MB file allocated %d bytes", d)
	}

	exact := []byte(goodConfig)
	exact = append(exact, strings.Repeat("#"+strings.Repeat("x", 62)+"\n", (MaxFileBytes-len(exact))/64)...)
	exact = append(exact, strings.Repeat("#", MaxFileBytes-len(exact))...)
	p := filepath.Join(dir, "exact.yaml")
	os.WriteFile(p, exact, 0o600)
	if _, err := Load(p); err != nil {
		t.Fatalf("a file of exactly %d bytes: %v", len(exact), err)
	}
	os.WriteFile(p, append(exact, '\n'), 0o600)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "the file is 1048577 bytes") {
		t.Fatalf("one byte over: %v", err)
	}
	if _, err := LoadBytes("mem.yaml", append(exact, '\n')); err == nil || !strings.Contains(err.Error(), "mem.yaml: the file is 1048577 bytes") {
		t.Fatalf("LoadBytes one byte over: %v", err)
	}
}

// TestLoadRefusesNonRegularFiles: a FIFO (which would block the read for
// ever) or a directory where the configuration should be is refused at once.
func TestLoadRefusesNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip(err)
	}
	for path, want := range map[string]string{fifo: "fifo.yaml is a FIFO (named pipe), not a regular file", dir: "is a directory, not a regular file", "/dev/null": "/dev/null is a device, not a regular file"} {
		done := make(chan error, 1)
		go func() { _, err := Load(path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) || exitcode.CodeOf(err) != exitcode.ExitIO {
				t.Errorf("%s: %v (exit %d), want %q", path, err, exitcode.CodeOf(err), want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Load(%s) blocks", path)
		}
	}
}

// TestNamespaceFalseNeedsASingleUpstream: namespace: false (tools exposed
// without their upstream's prefix) is refused at load, at the setting's
// line, when there is more than one upstream, so that spawn-digest --check
// and SIGHUP refuse it too; serve used to refuse it only after opening a
// new audit epoch, without a line. With one upstream it loads.
func TestNamespaceFalseNeedsASingleUpstream(t *testing.T) {
	two := "version: 1\nupstreams:\n  - name: a\n    stdio: {command: x}\n    allow_unmeasured: true\n    namespace: false\n  - name: b\n    stdio: {command: y}\n    allow_unmeasured: true\n"
	_, err := LoadBytes("c.yaml", []byte(two))
	want := "c.yaml:6:16: upstreams[0] (a).namespace: namespace: false is only allowed with a single upstream (there are 2)"
	if err == nil || !strings.Contains(err.Error(), want) || exitcode.CodeOf(err) != exitcode.ExitConfig {
		t.Fatalf("err = %v (exit %d), want exit 4 and %q", err, exitcode.CodeOf(err), want)
	}
	if hs := strings.Join(exitcode.HintsOf(err), "\n"); !strings.Contains(hs, "remove namespace: false") {
		t.Errorf("hints %q do not say what to do", hs)
	}
	one := "version: 1\nupstreams:\n  - name: a\n    stdio: {command: x}\n    allow_unmeasured: true\n    namespace: false\n"
	c, err := LoadBytes("c.yaml", []byte(one))
	if err != nil || c.Upstream("a").Namespaced() {
		t.Fatalf("a single upstream with namespace: false: %v", err)
	}
}
