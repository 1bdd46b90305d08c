// Package credtest holds the real counterparts of the credential tests: a
// token service that mints per-identity tokens over HTTP on 127.0.0.1, an
// MCP upstream (go-sdk's server over Streamable HTTP) that accepts only
// tokens that service minted, tells each caller who it is, and can lag
// (answer 401 to a new token's first N requests, as an upstream that has
// not seen it yet does) or revoke; and an exec credential helper (Helper, a
// shell script with curl) that asks the token service for a token, as a
// kubectl exec plugin asks its cloud.
package credtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Upstream is a token service and an MCP server that trusts it.
type Upstream struct {
	// URL is the MCP endpoint; MintURL the token service's.
	URL, MintURL string

	mu       sync.Mutex
	tokens   map[string]*issued // token -> what it was issued for
	mints    map[string]int     // identity -> tokens minted
	lag      int                // a new token's first lag requests get 401
	ttl      time.Duration
	seen     []string // every Authorization header the MCP server got
	refused  int
	accepted map[string]int // identity -> accepted requests
	srv      *http.Server
	verify   func(token string) (identity string, err error)
	issuer   string // advertised in 401s and the protected resource metadata
}

// Advertise makes the upstream an MCP resource server of issuer: its 401
// answers carry resource_metadata (RFC 9728), served at
// /.well-known/oauth-protected-resource/mcp.
func (u *Upstream) Advertise(issuer string) {
	u.mu.Lock()
	u.issuer = issuer
	u.mu.Unlock()
}

// Trust makes the upstream accept, besides its token service's tokens,
// every token verify accepts (a JWT of an authorization server), as the
// identity verify returns; each one counts as minted when first seen, and
// lags like a minted one.
func (u *Upstream) Trust(verify func(token string) (identity string, err error)) {
	u.mu.Lock()
	u.verify = verify
	u.mu.Unlock()
}

type issued struct {
	identity string
	groups   []string
	audience string
	left     int // requests still refused (lag)
	revoked  bool
}

// Start runs the upstream on 127.0.0.1 until the test ends.
func Start(t testing.TB) *Upstream {
	t.Helper()
	u := &Upstream{tokens: map[string]*issued{}, mints: map[string]int{}, accepted: map[string]int{}, ttl: time.Hour}
	server := mcp.NewServer(&mcp.Implementation{Name: "credtest-upstream", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "whoami", Description: "says who the caller's credential belongs to"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, WhoAmI, error) {
			who := WhoAmI{Identity: req.Extra.Header.Get("X-Credtest-Identity"), Audience: req.Extra.Header.Get("X-Credtest-Audience")}
			groups := req.Extra.Header.Get("X-Credtest-Groups")
			if groups != "" {
				who.Groups = strings.Split(groups, ",")
			}
			return nil, who, nil
		})
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /mint", u.mint)
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp", func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		iss := u.issuer
		u.mu.Unlock()
		if iss == "" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"resource": u.URL, "authorization_servers": []string{iss}, "bearer_methods_supported": []string{"header"}})
	})
	mux.Handle("/mcp", u.auth(mcpHandler))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go u.srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = u.srv.Shutdown(ctx)
	})
	base := "http://" + ln.Addr().String()
	u.URL, u.MintURL = base+"/mcp", base+"/mint"
	return u
}

// WhoAmI is the whoami tool's result.
type WhoAmI struct {
	Identity string   `json:"identity"`
	Groups   []string `json:"groups,omitempty"`
	Audience string   `json:"audience,omitempty"`
}

// WhoAmIVia calls the gateway's remote__whoami (the upstream named
// "remote") in session cs and returns who the upstream saw.
func WhoAmIVia(t testing.TB, cs *mcp.ClientSession) (WhoAmI, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "remote__whoami", Arguments: map[string]any{}})
	if err != nil {
		return WhoAmI{}, err
	}
	if res.IsError {
		var text string
		if len(res.Content) > 0 {
			if tc, ok := res.Content[0].(*mcp.TextContent); ok {
				text = tc.Text
			}
		}
		return WhoAmI{}, fmt.Errorf("tool error: %s", text)
	}
	var w WhoAmI
	b, _ := json.Marshal(res.StructuredContent)
	err = json.Unmarshal(b, &w)
	return w, err
}

// SetLag makes each token minted from now on refused (401) for its first n
// requests.
func (u *Upstream) SetLag(n int) {
	u.mu.Lock()
	u.lag = n
	u.mu.Unlock()
}

// SetTTL sets the lifetime of the tokens minted from now on.
func (u *Upstream) SetTTL(d time.Duration) {
	u.mu.Lock()
	u.ttl = d
	u.mu.Unlock()
}

// Revoke revokes every token minted for identity so far.
func (u *Upstream) Revoke(identity string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, is := range u.tokens {
		if is.identity == identity {
			is.revoked = true
		}
	}
}

// RevokeAll revokes every token, and every token minted from now on too.
func (u *Upstream) RevokeAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, is := range u.tokens {
		is.revoked = true
	}
	u.lag = 1 << 30
}

// Mints is how many tokens were minted for identity.
func (u *Upstream) Mints(identity string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.mints[identity]
}

// Refused is how many requests the MCP server answered 401.
func (u *Upstream) Refused() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.refused
}

// Accepted is how many requests identity made with an accepted token.
func (u *Upstream) Accepted(identity string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.accepted[identity]
}

// Seen is every Authorization header the MCP server got.
func (u *Upstream) Seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

// Issue mints a token for identity directly (as the helper's POST does).
func (u *Upstream) Issue(identity string, groups []string, audience string) (token string, expires time.Time) {
	b := make([]byte, 24)
	rand.Read(b)
	token = "ct_" + hex.EncodeToString(b)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.tokens[token] = &issued{identity: identity, groups: groups, audience: audience, left: u.lag}
	u.mints[identity]++
	return token, time.Now().Add(u.ttl).UTC().Truncate(time.Second)
}

// mint is the token service: POST {identity, groups, audience} -> {token, expires_at}.
func (u *Upstream) mint(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Identity string   `json:"identity"`
		Groups   []string `json:"groups"`
		Audience string   `json:"audience"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&in); err != nil || in.Identity == "" {
		http.Error(w, "want {identity}", http.StatusBadRequest)
		return
	}
	tok, exp := u.Issue(in.Identity, in.Groups, in.Audience)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"token": tok, "expires_at": exp.Format(time.RFC3339)})
}

// auth admits a request only with a token the service minted, not revoked,
// past its lag; it tells the MCP server whose it is.
func (u *Upstream) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k := range r.Header {
			if strings.HasPrefix(k, "X-Credtest-") {
				r.Header.Del(k) // only this middleware says who it is
			}
		}
		h := r.Header.Get("Authorization")
		tok, ok := strings.CutPrefix(h, "Bearer ")
		u.mu.Lock()
		u.seen = append(u.seen, h)
		is, verify := u.tokens[tok], u.verify
		u.mu.Unlock()
		if is == nil && ok && verify != nil {
			if id, err := verify(tok); err == nil {
				u.mu.Lock()
				if is = u.tokens[tok]; is == nil {
					is = &issued{identity: id, left: u.lag}
					u.tokens[tok] = is
					u.mints[id]++
				}
				u.mu.Unlock()
			}
		}
		u.mu.Lock()
		switch {
		case !ok || is == nil || is.revoked:
			ok = false
		case is.left > 0:
			is.left--
			ok = false
		default:
			u.accepted[is.identity]++
		}
		if !ok {
			u.refused++
		}
		u.mu.Unlock()
		if !ok {
			u.mu.Lock()
			advertised := u.issuer != ""
			u.mu.Unlock()
			if advertised {
				w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="`+strings.TrimSuffix(u.URL, "/mcp")+`/.well-known/oauth-protected-resource/mcp"`)
			} else {
				w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			}
			http.Error(w, "unknown, revoked or not yet valid token", http.StatusUnauthorized)
			return
		}
		r.Header.Set("X-Credtest-Identity", is.identity)
		r.Header.Set("X-Credtest-Groups", strings.Join(is.groups, ","))
		r.Header.Set("X-Credtest-Audience", is.audience)
		next.ServeHTTP(w, r)
	})
}

// Helper writes the exec helper that mints tokens for identities at u's
// token service: a shell script that posts its stdin with curl (which
// scripts/test.sh requires) and prints the answer, after delay if set.
func (u *Upstream) Helper(t testing.TB, delay time.Duration) string {
	t.Helper()
	script := "#!/bin/sh\nset -e\n"
	if delay > 0 {
		script += fmt.Sprintf("sleep %.3f\n", delay.Seconds())
	}
	script += "exec curl -sS --fail --max-time 30 -H 'Content-Type: application/json' --data-binary @- \"$CREDTEST_MINT_URL\"\n"
	path := t.TempDir() + "/mint-helper"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// HelperEnv is the variable that makes the test binary the exec helper
// (HelperMain) for the tests of its failures: its value is the mode,
// "sleep" (never answers), "env" (prints its environment as the token,
// hex-encoded), "big" (prints more than the bound) or "fail" (exits 3
// after writing to stderr).
const HelperEnv = "CMCP_CREDTEST_HELPER"

// HelperMain runs the exec helper if the test binary was started as one
// (HelperEnv set) and exits; call it first in TestMain.
func HelperMain() {
	mode, ok := os.LookupEnv(HelperEnv)
	if !ok {
		return
	}
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		os.Exit(2)
	}
	switch {
	case mode == "sleep":
		time.Sleep(time.Hour)
	case mode == "env":
		fmt.Printf(`{"token": %q}`, hex.EncodeToString([]byte(strings.Join(os.Environ(), "\n")+"\n--stdin--\n"+string(in))))
	case mode == "big":
		fmt.Printf(`{"token": "%s"}`, strings.Repeat("a", 70<<10))
	case mode == "fail":
		fmt.Fprintln(os.Stderr, "ct_secret-that-must-not-leak")
		os.Exit(3)
	case mode == "stdout-secret":
		fmt.Print(`{"token": "ct_secret-that-must-not-leak", "bogus": 1}`)
	}
	os.Exit(0)
}
