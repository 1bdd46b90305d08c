package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCredentialSourceErrors: every bad credential: section is refused at
// the line of what is wrong, saying what to write instead.
func TestCredentialSourceErrors(t *testing.T) {
	up := func(cred string) string {
		return "version: 1\nupstreams:\n  - name: api\n    http:\n      url: https://api.example/mcp\n      credential:\n" + cred
	}
	for _, tt := range []struct{ name, yaml, want, hint string }{
		{"no source", up("        exec: {command: /bin/mint}\n"), "c.yaml:7:9: upstreams[0] (api).http.credential.source: missing: exec, client_credentials", ""},
		{"unknown source", up("        source: password\n"), `c.yaml:7:17: upstreams[0] (api).http.credential.source: "password": want exec`, ""},
		{"unknown key", up("        source: exec\n        exce: {command: x}\n"), `c.yaml:8:9: unknown key "exce" in upstreams[0].http.credential`, `did you mean "exec"`},
		{"exec without command", up("        source: exec\n        exec: {args: [a]}\n"), "c.yaml:8:15: upstreams[0] (api).http.credential.exec.command: missing: the helper program", ""},
		{"exec bad env", up("        source: exec\n        exec: {command: /bin/m, env: {'A B': x}}\n"), `upstreams[0] (api).http.credential.exec.env: "A B" is not a valid environment variable name`, ""},
		{"exec negative timeout", up("        source: exec\n        exec: {command: /bin/m, timeout: -1s}\n"), "c.yaml:8:42: upstreams[0] (api).http.credential.exec.timeout: negative duration", ""},
		{"exec with oauth", up("        source: exec\n        exec: {command: /bin/m}\n        oauth: {client_id: x}\n"), "c.yaml:9:16: upstreams[0] (api).http.credential.oauth: applies to the OAuth sources, not exec", ""},
		{"oauth missing", up("        source: client_credentials\n"), "c.yaml:7:9: upstreams[0] (api).http.credential.oauth: missing: the OAuth client", ""},
		{"no client id", up("        source: client_credentials\n        oauth: {token_endpoint: https://as/token, client_secret_env: S}\n"), "upstreams[0] (api).http.credential.oauth.client_id: missing", ""},
		{"no endpoint", up("        source: token_exchange\n        oauth: {client_id: gw, client_secret_env: S}\n"), "oauth: missing: issuer (its metadata is discovered) or token_endpoint", ""},
		{"no secret", up("        source: client_credentials\n        oauth: {client_id: gw, issuer: https://as}\n"), "oauth.client_secret_env: missing: client_credentials authenticates the gateway", ""},
		{"two secrets", up("        source: client_credentials\n        oauth: {client_id: gw, issuer: https://as, client_secret_env: S, client_secret_file: s}\n"), "set client_secret_env or client_secret_file, not both", ""},
		{"no login_url", up("        source: authorization_code\n        oauth: {client_id: gw}\n"), "oauth.login_url: missing: the gateway's URL of the sign-in pages", "register <login_url>/callback"},
		{"login_url root", up("        source: authorization_code\n        oauth: {client_id: gw, login_url: 'https://gw.example/'}\n"), "oauth.login_url: \"https://gw.example/\": want a path of its own", ""},
		{"login_url elsewhere", up("        source: client_credentials\n        oauth: {client_id: gw, issuer: https://as, client_secret_env: S, login_url: https://gw/x}\n"), "oauth.login_url: applies to source: authorization_code only", ""},
		{"plaintext issuer", up("        source: authorization_code\n        oauth: {client_id: gw, issuer: 'http://as.example', login_url: https://gw/l}\n"), "c.yaml:8:40: upstreams[0] (api).http.credential.oauth.issuer: plaintext http:// to as.example", "allow_plaintext"},
		{"subject type elsewhere", up("        source: authorization_code\n        oauth: {client_id: gw, issuer: https://as, subject_token_type: x, login_url: https://gw/l}\n"), "oauth.subject_token_type: applies to source: token_exchange only", ""},
		{"with bearer token", "version: 1\nupstreams:\n  - name: api\n    http:\n      url: https://api.example/mcp\n      bearer_token_env: TOKEN\n      credential: {source: exec, exec: {command: /bin/m}}\n",
			"c.yaml:7:19: upstreams[0] (api).http.credential: a credential source and a static bearer token both set Authorization", "remove bearer_token_env"},
		{"with Authorization header", "version: 1\nupstreams:\n  - name: api\n    http:\n      url: https://api.example/mcp\n      headers_from_file: {authorization: f}\n      credential: {source: exec, exec: {command: /bin/m}}\n",
			"credential: a credential source and headers_from_file both set Authorization", ""},
		{"per identity on a shared connection", "version: 1\nupstreams:\n  - name: api\n    lifecycle: shared\n    http:\n      url: https://api.example/mcp\n      credential: {source: exec, exec: {command: /bin/m}}\n",
			"c.yaml:7:19: upstreams[0] (api).http.credential: a exec credential is minted per identity, which a shared connection (lifecycle: shared) cannot carry", "client_credentials"},
		{"cache size", up("        source: exec\n        exec: {command: /bin/m}\n        cache_size: -1\n"), "c.yaml:9:21: upstreams[0] (api).http.credential.cache_size: -1: want 1 to 1000000", ""},
		{"retry attempts", up("        source: exec\n        exec: {command: /bin/m}\n        retry: {attempts: 50}\n"), "c.yaml:9:27: upstreams[0] (api).http.credential.retry.attempts: 50: want 0 to 20", ""},
		{"retry max below initial", up("        source: exec\n        exec: {command: /bin/m}\n        retry: {initial: 2s, max: 1s}\n"), "retry.max: 1s is less than initial 2s", ""},
		{"audience", up("        source: exec\n        exec: {command: /bin/m}\n        audience: not a uri\n"), `credential.audience: "not a uri": want an absolute URI`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadBytes("c.yaml", []byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error:\n  %v\nwant it to contain:\n  %s", err, tt.want)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Errorf("not a *config.Error: %T", err)
			}
			if tt.hint != "" && !strings.Contains(strings.Join(ce.Hints(), "\n"), tt.hint) && !strings.Contains(err.Error(), tt.hint) {
				t.Errorf("no hint with %q: %v", tt.hint, ce.Hints())
			}
		})
	}
}

func TestCredentialSourceLoads(t *testing.T) {
	c, err := LoadBytes("c.yaml", []byte(`version: 1
upstreams:
  - name: api
    http:
      url: https://api.example/mcp
      credential:
        source: exec
        exec:
          command: ./bin/mint
          args: [--profile, prod]
          env: {REGION: eu}
          timeout: 5s
        cache_size: 10
        refresh_skew: 30s
        retry: {attempts: 3, initial: 100ms, max: 1s}
  - name: svc
    lifecycle: shared
    http:
      url: https://svc.example/mcp
      credential:
        source: client_credentials
        oauth: {client_id: gw, issuer: https://as.example, client_secret_file: secret.txt, scopes: [read]}
  - name: a
    stdio: {command: x, env_allow: [SVC_SECRET]}
    allow_unmeasured: true
`))
	if err != nil {
		// client_secret_file is fine; the stdio env_allow is fine too.
		t.Fatal(err)
	}
	cr := c.Upstreams[0].HTTP.Credential
	if cr.Source != SourceExec || !strings.HasSuffix(cr.Exec.Command, "/bin/mint") || !strings.HasPrefix(cr.Exec.Command, "/") ||
		cr.Exec.Timeout != 5*time.Second || cr.CacheSize != 10 || cr.Retry.Attempts != 3 || cr.Retry.Max != time.Second {
		t.Errorf("loaded %+v %+v", cr, cr.Exec)
	}
	if !strings.HasPrefix(c.Upstreams[1].HTTP.Credential.OAuth.ClientSecretFile, "/") {
		t.Error("client_secret_file not made absolute")
	}
	// A client secret's variable is another upstream's credential: no
	// child gets it.
	_, err = LoadBytes("c.yaml", []byte(`version: 1
upstreams:
  - name: svc
    lifecycle: shared
    http:
      url: https://svc.example/mcp
      credential:
        source: client_credentials
        oauth: {client_id: gw, issuer: https://as.example, client_secret_env: SVC_SECRET}
  - name: a
    stdio: {command: x, env_allow: [SVC_SECRET]}
    allow_unmeasured: true
`))
	if err == nil || !strings.Contains(err.Error(), "SVC_SECRET holds the credential of another upstream (upstreams[0] (svc).http.credential.oauth.client_secret_env)") {
		t.Fatalf("env_allow of a client secret: %v", err)
	}
}
