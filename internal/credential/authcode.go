package credential

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// AuthorizationCode is the authorization_code source: the gateway is the
// OAuth client of the upstream's authorization server for each identity,
// as remote MCP servers (GitHub, Jira, Linear) require. An identity without
// a grant gets an *AuthorizationRequiredError whose URL is a page of the
// gateway (Handler, mounted at LoginURL) that runs the code flow with PKCE
// for that identity; the gateway answers the agent's call with it as an
// MCP URL-mode elicitation (-32042). The refresh token is kept encrypted
// (AES-256-GCM, under a key drawn at start and held in memory only) and
// never leaves the gateway; access tokens are minted from it.
type AuthorizationCode struct {
	Client *OAuthClient
	// LoginURL is the gateway's external URL of this upstream's login
	// pages: LoginURL+"/start?id=..." starts a sign-in, and
	// LoginURL+"/callback" is the redirect URI to register at the
	// authorization server.
	LoginURL string
	// OnComplete is called when an identity finished signing in (for the
	// notifications/elicitation/complete the gateway sends).
	OnComplete func(identity, elicitationID string)
	// PendingTTL bounds how long a sign-in link works (default 10 min).
	PendingTTL time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time

	once    sync.Once
	aead    cipher.AEAD
	mu      sync.Mutex
	grants  map[string]*grant   // identity -> grant
	pending map[string]*pending // elicitation id -> sign-in
	byState map[string]*pending // OAuth state -> sign-in
	byIdent map[string]*pending // identity -> its open sign-in
}

type grant struct {
	refresh []byte // nonce || AES-GCM(refresh token), "" if none
	access  Token  // from the code exchange, handed out once
}

type pending struct {
	id, identity    string
	state, verifier string
	created         time.Time
}

// Kind is "authorization_code".
func (s *AuthorizationCode) Kind() string { return "authorization_code" }

func (s *AuthorizationCode) init() {
	s.once.Do(func() {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			panic("credential: no randomness for the grant key: " + err.Error())
		}
		blk, _ := aes.NewCipher(key)
		s.aead, _ = cipher.NewGCM(blk)
		s.grants, s.pending, s.byState, s.byIdent = map[string]*grant{}, map[string]*pending{}, map[string]*pending{}, map[string]*pending{}
		if s.PendingTTL <= 0 {
			s.PendingTTL = 10 * time.Minute
		}
		if s.Now == nil {
			s.Now = time.Now
		}
	})
}

func (s *AuthorizationCode) seal(identity string, v Secret) []byte {
	if v.IsZero() {
		return nil
	}
	nonce := make([]byte, s.aead.NonceSize())
	rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, []byte(v.v), []byte(identity))
}

func (s *AuthorizationCode) open(identity string, b []byte) (Secret, error) {
	n := s.aead.NonceSize()
	if len(b) < n {
		return Secret{}, errors.New("sealed grant too short")
	}
	p, err := s.aead.Open(nil, b[:n], b[n:], []byte(identity))
	if err != nil {
		return Secret{}, err
	}
	return NewSecret(string(p)), nil
}

// HasGrant reports whether identity has signed in (and not been forgotten).
func (s *AuthorizationCode) HasGrant(identity string) bool {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grants[identity] != nil
}

// Forget drops the grants of the identities named.
func (s *AuthorizationCode) Forget(names ...string) {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		delete(s.grants, n)
	}
}

// Mint returns the access token of the identity's fresh grant, or one
// minted from its refresh token; without a grant (or with one the server
// no longer honours), an *AuthorizationRequiredError.
func (s *AuthorizationCode) Mint(ctx context.Context, r Request) (Token, error) {
	s.init()
	who := r.Identity.Name
	s.mu.Lock()
	g := s.grants[who]
	if g != nil && !g.access.Value.IsZero() {
		t := g.access
		g.access = Token{} // once: a later mint means this one was refused or expires
		if t.Expiry.IsZero() || s.Now().Before(t.Expiry) {
			s.mu.Unlock()
			return t, nil
		}
	}
	var sealed []byte
	if g != nil {
		sealed = g.refresh
	}
	s.mu.Unlock()
	if sealed != nil {
		rt, err := s.open(who, sealed)
		if err != nil {
			return Token{}, fmt.Errorf("upstream %q: the grant of %q cannot be read: %v", r.Upstream, who, err)
		}
		t, next, err := s.Client.token(ctx, "refresh_token", url.Values{"refresh_token": {rt.v}})
		var oe *OAuthError
		switch {
		case err == nil:
			s.mu.Lock()
			if !next.IsZero() { // rotated
				g.refresh = s.seal(who, next)
			}
			s.mu.Unlock()
			return t, nil
		case errors.As(err, &oe) && (oe.Code == "invalid_grant" || oe.Status == http.StatusBadRequest || oe.Status == http.StatusUnauthorized):
			// Revoked or expired: sign in again.
			s.mu.Lock()
			if s.grants[who] == g {
				delete(s.grants, who)
			}
			s.mu.Unlock()
		default:
			return Token{}, fmt.Errorf("%w (refreshing the grant of %q)", err, who)
		}
	}
	return Token{}, s.required(r)
}

// required opens (or reuses) the identity's sign-in.
func (s *AuthorizationCode) required(r Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire()
	p := s.byIdent[r.Identity.Name]
	if p == nil {
		p = &pending{id: randomID(), identity: r.Identity.Name, created: s.Now()}
		s.pending[p.id] = p
		s.byIdent[p.identity] = p
	}
	return &AuthorizationRequiredError{Upstream: r.Upstream, Identity: r.Identity.Name, ElicitationID: p.id,
		URL: s.LoginURL + "/start?id=" + p.id}
}

// expire drops sign-ins older than PendingTTL (s.mu held).
func (s *AuthorizationCode) expire() {
	for id, p := range s.pending {
		if s.Now().Sub(p.created) > s.PendingTTL {
			delete(s.pending, id)
			delete(s.byState, p.state)
			if s.byIdent[p.identity] == p {
				delete(s.byIdent, p.identity)
			}
		}
	}
}

func randomID() string {
	b := make([]byte, 24)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// AuthorizationRequiredError says that identity has to sign in at the
// upstream's authorization server first, at URL (a page of the gateway).
// The gateway answers the call with it as an MCP URL-mode elicitation
// (Elicitation). The URL is a single-use sign-in link for that identity,
// valid for PendingTTL: it holds no credential.
type AuthorizationRequiredError struct {
	Upstream, Identity string
	ElicitationID      string
	URL                string
}

func (e *AuthorizationRequiredError) Error() string {
	return fmt.Sprintf("upstream %q: %q has not authorized the gateway to act for it yet; open %s to sign in, then call again", e.Upstream, e.Identity, e.URL)
}

// Elicitation is the MCP URLElicitationRequiredError (-32042) that asks
// the agent's user to open the sign-in page.
func (e *AuthorizationRequiredError) Elicitation() error {
	return mcp.URLElicitationRequiredError([]*mcp.ElicitParams{{
		Mode:          "url",
		ElicitationID: e.ElicitationID,
		URL:           e.URL,
		Message:       fmt.Sprintf("Sign in to %s so that the gateway can call it as you (%s).", e.Upstream, e.Identity),
	}})
}

// Handler serves the sign-in pages under LoginURL's path (mount it with
// that prefix stripped): /start?id= redirects to the authorization
// server with PKCE (S256) and a fresh state; /callback exchanges the code
// and keeps the grant.
func (s *AuthorizationCode) Handler() http.Handler {
	s.init()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /start", s.start)
	mux.HandleFunc("GET /callback", s.callback)
	return mux
}

func (s *AuthorizationCode) start(w http.ResponseWriter, r *http.Request) {
	if err := s.Client.endpoints(r.Context(), true); err != nil {
		page(w, http.StatusBadGateway, "The gateway could not reach the upstream's authorization server.", err.Error())
		return
	}
	s.mu.Lock()
	s.expire()
	p := s.pending[r.URL.Query().Get("id")]
	if p == nil {
		s.mu.Unlock()
		page(w, http.StatusNotFound, "This sign-in link is not valid (any more).", "Call the tool again to get a new one.")
		return
	}
	if p.state != "" {
		delete(s.byState, p.state)
	}
	p.state, p.verifier = randomID(), randomID()+randomID()
	s.byState[p.state] = p
	s.mu.Unlock()
	sum := sha256.Sum256([]byte(p.verifier))
	q := url.Values{
		"response_type":         {"code"},
		"client_id":             {s.Client.ClientID},
		"redirect_uri":          {s.LoginURL + "/callback"},
		"state":                 {p.state},
		"code_challenge":        {base64.RawURLEncoding.EncodeToString(sum[:])},
		"code_challenge_method": {"S256"},
	}
	if len(s.Client.Scopes) > 0 {
		q.Set("scope", joinScopes(s.Client.Scopes))
	}
	if s.Client.Resource != "" {
		q.Set("resource", s.Client.Resource)
	}
	to, err := url.Parse(s.Client.AuthorizationEndpoint)
	if err != nil {
		page(w, http.StatusBadGateway, "The authorization endpoint is not a URL.", "")
		return
	}
	aq := to.Query()
	for k, v := range q {
		aq[k] = v
	}
	to.RawQuery = aq.Encode()
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, to.String(), http.StatusFound)
}

func (s *AuthorizationCode) callback(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	s.mu.Lock()
	s.expire()
	p := s.byState[q.Get("state")]
	if p != nil {
		delete(s.byState, p.state) // a state is used once
	}
	s.mu.Unlock()
	if p == nil || q.Get("state") == "" {
		page(w, http.StatusBadRequest, "This sign-in is not valid (any more).", "Call the tool again to get a new link.")
		return
	}
	if e := q.Get("error"); e != "" {
		page(w, http.StatusForbidden, "The authorization server refused the sign-in.", cleanText(e+": "+q.Get("error_description"), 200))
		return
	}
	t, refresh, err := s.Client.token(r.Context(), "authorization_code", url.Values{
		"code": {q.Get("code")}, "redirect_uri": {s.LoginURL + "/callback"}, "code_verifier": {p.verifier},
	})
	if err != nil {
		page(w, http.StatusBadGateway, "The gateway could not complete the sign-in.", err.Error())
		return
	}
	s.mu.Lock()
	s.grants[p.identity] = &grant{refresh: s.seal(p.identity, refresh), access: t}
	delete(s.pending, p.id)
	if s.byIdent[p.identity] == p {
		delete(s.byIdent, p.identity)
	}
	s.mu.Unlock()
	if s.OnComplete != nil {
		s.OnComplete(p.identity, p.id)
	}
	page(w, http.StatusOK, "Signed in to "+s.Client.Upstream+" as "+p.identity+".", "You can close this page and call the tool again.")
}

func page(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	w.WriteHeader(status)
	// Both go into element text, where escaping <, >, &, ' and " is
	// all it takes (html/template, which would do the same here, is not
	// linked into the gateway for one page).
	_, _ = io.WriteString(w, `<!doctype html><html><head><meta charset="utf-8"><title>cmcp</title></head><body><h1>`+
		html.EscapeString(title)+`</h1><p>`+html.EscapeString(detail)+`</p></body></html>`)
}

func joinScopes(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += v
	}
	return out
}
