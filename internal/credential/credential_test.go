package credential_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/contain"
	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/credential/credtest"
)

func TestMain(m *testing.M) {
	credtest.HelperMain()
	os.Exit(m.Run())
}

// helper is the exec source that asks u's token service (the test binary
// run again as the helper).
func helper(t testing.TB, u *credtest.Upstream, delay time.Duration) *credential.Exec {
	return &credential.Exec{Command: u.Helper(t, delay), Env: map[string]string{"CREDTEST_MINT_URL": u.MintURL}, Timeout: 30 * time.Second}
}

// fastRetry keeps the propagation backoff short in tests.
var fastRetry = credential.Retry{Attempts: 6, Initial: 5 * time.Millisecond, Max: 40 * time.Millisecond}

// connect opens an MCP session with the upstream as id, through b.
func connect(t testing.TB, u *credtest.Upstream, b *credential.Broker, id credential.Identity) (*mcp.ClientSession, error) {
	t.Helper()
	tr := &credential.Transport{Broker: b, Identity: id, Base: http.DefaultTransport}
	client := mcp.NewClient(&mcp.Implementation{Name: "test-gateway", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: u.URL, HTTPClient: &http.Client{Transport: tr}, MaxRetries: -1}, nil)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { cs.Close() })
	return cs, nil
}

func whoami(t testing.TB, cs *mcp.ClientSession) (credtest.WhoAmI, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami"})
	if err != nil {
		return credtest.WhoAmI{}, err
	}
	if res.IsError {
		return credtest.WhoAmI{}, fmt.Errorf("tool error: %v", res.Content)
	}
	var w credtest.WhoAmI
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &w); err != nil {
		return w, err
	}
	return w, nil
}

func TestTwoIdentitiesNeverShareACredential(t *testing.T) {
	u := credtest.Start(t)
	var mu sync.Mutex
	var minted []credential.Minted
	b := credential.NewBroker("remote", helper(t, u, 0), credential.Options{Audience: u.URL, Retry: fastRetry,
		OnMint: func(m credential.Minted) { mu.Lock(); minted = append(minted, m); mu.Unlock() }})
	alice := credential.Identity{Name: "alice", Groups: []string{"ops"}}
	bob := credential.Identity{Name: "bob"}
	for _, id := range []credential.Identity{alice, bob, alice} {
		cs, err := connect(t, u, b, id)
		if err != nil {
			t.Fatalf("%s: connect: %v", id.Name, err)
		}
		w, err := whoami(t, cs)
		if err != nil {
			t.Fatalf("%s: whoami: %v", id.Name, err)
		}
		if w.Identity != id.Name {
			t.Fatalf("%s called the upstream as %q", id.Name, w.Identity)
		}
		if strings.Join(w.Groups, ",") != strings.Join(id.Groups, ",") || w.Audience != u.URL {
			t.Errorf("%s: the helper got groups %v audience %q, want %v %q", id.Name, w.Groups, w.Audience, id.Groups, u.URL)
		}
	}
	if u.Mints("alice") != 1 || u.Mints("bob") != 1 {
		t.Errorf("mints: alice %d, bob %d; want 1 each (alice's second session uses the cached one)", u.Mints("alice"), u.Mints("bob"))
	}
	ca, _ := b.Get(context.Background(), alice)
	cb, _ := b.Get(context.Background(), bob)
	if ca.Fingerprint() == cb.Fingerprint() {
		t.Errorf("alice and bob have the same credential (%s)", ca.Fingerprint())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(minted) != 2 || minted[0].Identity != "alice" || minted[1].Identity != "bob" || minted[0].Source != "exec" ||
		minted[0].Reason != "first" || minted[0].Expiry.IsZero() || minted[0].Fingerprint != ca.Fingerprint() {
		t.Errorf("mint records: %+v", minted)
	}
	// No request reached the upstream with another identity's token or
	// with none at all.
	for _, h := range u.Seen() {
		if !strings.HasPrefix(h, "Bearer ct_") {
			t.Errorf("the upstream got Authorization %q", h)
		}
	}
}

func TestConcurrentFirstCallsMintOnce(t *testing.T) {
	u := credtest.Start(t)
	// A slow helper: every first call arrives while the mint runs.
	b := credential.NewBroker("remote", helper(t, u, 300*time.Millisecond), credential.Options{Retry: fastRetry})
	id := credential.Identity{Name: "carol"}
	// 100 first requests at once (an initialize each, as 100 sessions
	// opening together send), each through its own connection's
	// transport, as the gateway has one per session.
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &credential.Transport{Broker: b, Identity: id, Base: http.DefaultTransport}}
			req, _ := http.NewRequest(http.MethodPost, u.URL, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := c.Do(req)
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs <- fmt.Errorf("initialize: %s", resp.Status)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if u.Accepted("carol") != n {
		t.Errorf("the upstream accepted %d of carol's requests, want %d", u.Accepted("carol"), n)
	}
	if got := u.Mints("carol"); got != 1 {
		t.Errorf("%d concurrent first calls minted %d credentials, want 1", n, got)
	}
	if b.Mints() != 1 {
		t.Errorf("broker counted %d mints", b.Mints())
	}
}

func TestFreshCredentialRefusedIsRetriedWithBackoff(t *testing.T) {
	u := credtest.Start(t)
	u.SetLag(3) // the upstream refuses a new token's first 3 requests
	b := credential.NewBroker("remote", helper(t, u, 0), credential.Options{Retry: fastRetry})
	cs, err := connect(t, u, b, credential.Identity{Name: "dave"})
	if err != nil {
		t.Fatalf("connect with a lagging upstream: %v", err)
	}
	if w, err := whoami(t, cs); err != nil || w.Identity != "dave" {
		t.Fatalf("whoami: %v %v", w, err)
	}
	if u.Mints("dave") != 1 || u.Refused() != 3 {
		t.Errorf("mints %d refused %d: want 1 mint, the same credential sent again after 3 refusals", u.Mints("dave"), u.Refused())
	}

	// More refusals than attempts: the call fails, naming the upstream
	// and the identity, never the credential.
	u.SetLag(100)
	b2 := credential.NewBroker("remote", helper(t, u, 0), credential.Options{Retry: credential.Retry{Attempts: 2, Initial: time.Millisecond, Max: time.Millisecond}})
	_, err = connect(t, u, b2, credential.Identity{Name: "erin"})
	var re *credential.RefusedError
	if !errors.As(err, &re) || re.Upstream != "remote" || re.Identity != "erin" || !errors.Is(err, credential.ErrRefused) {
		t.Fatalf("want a RefusedError naming remote and erin, got %v", err)
	}
	for _, h := range u.Seen() {
		tok := strings.TrimPrefix(h, "Bearer ")
		if strings.Contains(err.Error(), tok) {
			t.Fatalf("the error holds the credential: %v", err)
		}
	}
	if !strings.Contains(err.Error(), `"remote"`) || !strings.Contains(err.Error(), `"erin"`) {
		t.Errorf("error does not name upstream and identity: %v", err)
	}
}

func TestRevokedCachedCredentialIsReMintedOnceAtOnce(t *testing.T) {
	u := credtest.Start(t)
	// A backoff far longer than the test: a sleep would show.
	slow := credential.Retry{Attempts: 6, Initial: time.Hour, Max: time.Hour}
	var mu sync.Mutex
	var reasons []string
	b := credential.NewBroker("remote", helper(t, u, 0), credential.Options{Retry: slow,
		OnMint: func(m credential.Minted) { mu.Lock(); reasons = append(reasons, m.Reason); mu.Unlock() }})
	id := credential.Identity{Name: "frank"}
	cs, err := connect(t, u, b, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := whoami(t, cs); err != nil {
		t.Fatal(err)
	}
	before, _ := b.Get(context.Background(), id)
	u.Revoke("frank")
	start := time.Now()
	if w, err := whoami(t, cs); err != nil || w.Identity != "frank" {
		t.Fatalf("call after revocation: %v %v", w, err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the re-mint took %s: it slept", d)
	}
	after, _ := b.Get(context.Background(), id)
	if u.Mints("frank") != 2 || b.Mints() != 2 || after.Fingerprint() == before.Fingerprint() {
		t.Errorf("mints %d (broker %d), fingerprints %s -> %s: want exactly one new credential", u.Mints("frank"), b.Mints(), before.Fingerprint(), after.Fingerprint())
	}
	mu.Lock()
	if strings.Join(reasons, ",") != "first,refused" {
		t.Errorf("mint reasons %v", reasons)
	}
	mu.Unlock()
	cs.Close() // before RevokeAll: its DELETE would wait out the hour

	// Revoked again, and the source's new one refused too: the call
	// fails (after the re-mint's propagation retries, short here).
	b2 := credential.NewBroker("remote", helper(t, u, 0), credential.Options{Retry: credential.Retry{Attempts: 2, Initial: time.Millisecond, Max: time.Millisecond}})
	cs2, err := connect(t, u, b2, credential.Identity{Name: "grace"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := whoami(t, cs2); err != nil {
		t.Fatal(err)
	}
	u.RevokeAll()
	_, err = whoami(t, cs2)
	if err == nil || !strings.Contains(err.Error(), `"remote"`) || !strings.Contains(err.Error(), `"grace"`) {
		t.Fatalf("want the call to fail naming remote and grace, got %v", err)
	}
	if u.Mints("grace") != 2 {
		t.Errorf("grace: %d mints, want 2 (the first, and one after the revocation)", u.Mints("grace"))
	}
}

func TestCacheIsBoundedAndRefreshedBeforeExpiry(t *testing.T) {
	u := credtest.Start(t)
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	b := credential.NewBroker("remote", helper(t, u, 0), credential.Options{CacheSize: 2, RefreshSkew: time.Minute, Now: clock})
	ctx := context.Background()
	get := func(name string) *credential.Credential {
		c, err := b.Get(ctx, credential.Identity{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a1 := get("a")
	get("b")
	if get("a") != a1 {
		t.Fatal("a's credential was not cached")
	}
	get("c") // evicts b, the least recently used
	if b.Len() != 2 {
		t.Errorf("cache holds %d, bound 2", b.Len())
	}
	get("a")
	if u.Mints("a") != 1 {
		t.Errorf("a minted %d times", u.Mints("a"))
	}
	get("b")
	if u.Mints("b") != 2 {
		t.Errorf("b (evicted) minted %d times, want 2", u.Mints("b"))
	}
	// Expiry is an hour off: within the skew of it, a new one.
	mu.Lock()
	now = now.Add(time.Hour - 30*time.Second)
	mu.Unlock()
	if get("a") == a1 || u.Mints("a") != 2 {
		t.Errorf("a credential within the refresh skew of its expiry was used (mints %d)", u.Mints("a"))
	}
	// Forget: the identities whose tokens a reload revoked.
	if n := b.Forget("a", "nobody"); n != 1 {
		t.Errorf("Forget dropped %d", n)
	}
	if n := b.Keep(func(id string) bool { return id != "b" }); n != 1 || b.Len() != 0 {
		t.Errorf("Keep dropped %d, %d left", n, b.Len())
	}
}

func TestExecHelper(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("CMCP_GATEWAY_SECRET", "gateway-secret-value")
	req := credential.Request{Identity: credential.Identity{Name: "alice", Groups: []string{"dev", "ops"}, Token: credential.NewSecret("agent-token")}, Upstream: "remote", Audience: "https://api.example"}
	t.Run("minimal environment and its input", func(t *testing.T) {
		e := &credential.Exec{Command: exe, Env: map[string]string{credtest.HelperEnv: "env", "ONLY": "this"}}
		tok, err := e.Mint(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := hex.DecodeString(tok.Value.Reveal())
		env, stdin, _ := strings.Cut(string(raw), "\n--stdin--\n")
		want := credtest.HelperEnv + "=env\nONLY=this\nPATH=/usr/local/bin:/usr/bin:/bin"
		if env != want {
			t.Errorf("helper environment:\n%s\nwant only:\n%s", env, want)
		}
		if stdin != `{"identity":"alice","groups":["dev","ops"],"upstream":"remote","audience":"https://api.example"}` {
			t.Errorf("helper input: %s", stdin)
		}
		if strings.Contains(string(raw), "agent-token") {
			t.Error("the agent's own token reached the helper")
		}
	})
	for _, c := range []struct {
		name, mode string
		timeout    time.Duration
		want       string
	}{
		{"killed at its timeout", "sleep", 300 * time.Millisecond, "did not finish within 300ms and was killed"},
		{"output too large", "big", 0, "printed more than 65536 bytes on stdout"},
		{"exit status, stderr not shown", "fail", 0, "exited with exit status 3 (it wrote 29 bytes to stderr, not shown"},
		{"unknown field, output not quoted", "stdout-secret", 0, `(unknown field "bogus")`},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := &credential.Exec{Command: exe, Env: map[string]string{credtest.HelperEnv: c.mode}, Timeout: c.timeout}
			start := time.Now()
			_, err := e.Mint(context.Background(), req)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error with %q, got %v", c.want, err)
			}
			if !strings.Contains(err.Error(), `upstream "remote": credential helper `) || !strings.Contains(err.Error(), `for "alice"`) {
				t.Errorf("error does not say where: %v", err)
			}
			if strings.Contains(err.Error(), "must-not-leak") {
				t.Errorf("error holds what the helper printed: %v", err)
			}
			if time.Since(start) > 20*time.Second {
				t.Errorf("took %s", time.Since(start))
			}
		})
	}
}

func TestExecOutput(t *testing.T) {
	exe, _ := os.Executable()
	_ = exe
	for _, c := range []struct{ name, out, want string }{
		{"ok", `{"token":"abc","expires_at":"2999-01-01T00:00:00Z"}`, ""},
		{"no expiry", `{"token":"abc"}`, ""},
		{"not json", `abc`, "is not a JSON object"},
		{"two objects", `{"token":"abc"} {"token":"d"}`, "has more after the JSON object"},
		{"empty token", `{"token":""}`, "has no token"},
		{"token with space", `{"token":"a b"}`, "has a space"},
		{"bad time", `{"token":"abc","expires_at":"tomorrow"}`, "is not an RFC 3339 time"},
		{"past", `{"token":"abc","expires_at":"2001-01-01T00:00:00Z"}`, "is not in the future"},
		{"token not a string", `{"token":12}`, "(token is not a number)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok, err := credential.ParseExecOutputForTest([]byte(c.out))
			if c.want == "" {
				if err != nil || tok.Value.Reveal() != "abc" {
					t.Fatalf("%v %v", tok, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want %q, got %v", c.want, err)
			}
			if strings.Contains(err.Error(), "abc") {
				t.Errorf("error quotes the token: %v", err)
			}
		})
	}
}

func TestSecretNeverPrints(t *testing.T) {
	s := credential.NewSecret("hunter2")
	id := credential.Identity{Name: "a", Token: s}
	for _, got := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s %q %x", s, id, id, s, s, s)} {
		if strings.Contains(got, "hunter2") || strings.Contains(got, hex.EncodeToString([]byte("hunter2"))) {
			t.Errorf("printed: %s", got)
		}
	}
	b, _ := json.Marshal(id)
	if strings.Contains(string(b), "hunter2") {
		t.Errorf("JSON: %s", b)
	}
	if credential.Fingerprint(s) == credential.Fingerprint(credential.NewSecret("hunter3")) || !strings.HasPrefix(credential.Fingerprint(s), "hmac-sha256:") {
		t.Error("fingerprints")
	}
}

// FuzzExecOutput: whatever a helper prints, parsing it never panics, a
// token it accepts is a non-empty header-safe string, and an error never
// quotes the token it printed.
func FuzzExecOutput(f *testing.F) {
	for _, s := range []string{`{"token":"abc","expires_at":"2999-01-01T00:00:00Z"}`, `{"token":"abc"}`, `{"token":"a b"}`, `{"token":12}`,
		`{"token":"secret-tok","bogus":1}`, `{"token":"secret-tok","expires_at":"nope"}`, `{"token":"x"} {}`, ``, `null`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := credential.ParseExecOutputForTest(b)
		if err == nil {
			v := tok.Value.Reveal()
			if v == "" || strings.ContainsAny(v, " \t\r\n") {
				t.Fatalf("accepted token %q", v)
			}
			return
		}
		var o struct {
			Token any `json:"token"`
		}
		if json.Unmarshal(b, &o) == nil {
			// A token that appears once in the output (not also as a
			// field name or a time the error may quote).
			if s, ok := o.Token.(string); ok && len(s) >= 8 && strings.Count(string(b), s) == 1 && strings.Contains(err.Error(), s) {
				t.Fatalf("the error quotes the token: %v", err)
			}
		}
	})
}

// TestExecHelperIsNotTakenForAnOrphan: in a gateway that reaps the
// orphans it adopts (contain.Setup: a subreaper), a credential helper runs
// in a process group of its own, like an orphan's; its exit must not be
// reaped by the orphan reaper before Mint waits for it ("could not run:
// waitid: no child processes", seen once under load in
// TestServeMintsAnUpstreamCredentialPerAgent). Many short helpers in a row
// give the reaper every chance to win the race.
func TestExecHelperIsNotTakenForAnOrphan(t *testing.T) {
	if info := contain.Setup(); info.Mode == contain.ModeNone {
		t.Skipf("no subreaper here: %s", info.Why)
	}
	e := &credential.Exec{Command: "/bin/sh", Args: []string{"-c", `printf '{"token":"t-%s","expires_at":"2099-01-01T00:00:00Z"}' "$$"`}}
	req := credential.Request{Identity: credential.Identity{Name: "alice"}, Upstream: "remote"}
	for i := range 300 {
		if _, err := e.Mint(context.Background(), req); err != nil {
			t.Fatalf("mint %d: %v", i, err)
		}
	}
}
