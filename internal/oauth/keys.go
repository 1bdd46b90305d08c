package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"golang.org/x/sync/singleflight"
)

// keyCache holds the issuer's public keys. Verify reads them without a
// lock; a fetch replaces them whole. A fetch happens when there are none,
// on an unknown key ID (at most once per floor), and in the background
// when they are older than MaxAge; concurrent fetches are one.
type keyCache struct {
	cfg    *Config
	now    func() time.Time
	client *http.Client
	floor  time.Duration
	maxAge time.Duration

	set   atomic.Pointer[keySet]
	group singleflight.Group

	mu        sync.Mutex
	jwksURI   string    // discovered or configured
	lastFetch time.Time // last attempt, successful or not
	lastErr   error
	bgRunning bool
}

type keySet struct {
	byID    map[string]*jose.JSONWebKey
	only    *jose.JSONWebKey // the one key when there is exactly one
	fetched time.Time
}

func newKeyCache(cfg *Config, now func() time.Time) *keyCache {
	c := &keyCache{cfg: cfg, now: now, client: cfg.HTTPClient, floor: cfg.RefreshFloor, maxAge: cfg.MaxAge, jwksURI: cfg.JWKSURI}
	if c.client == nil {
		c.client = &http.Client{Timeout: 10 * time.Second}
	}
	if c.floor == 0 {
		c.floor = DefaultRefreshFloor
	}
	if c.maxAge == 0 {
		c.maxAge = time.Hour
	}
	return c
}

// key returns the key to check a token whose header names kid and alg.
func (c *keyCache) key(ctx context.Context, kid string, alg jose.SignatureAlgorithm) (any, error) {
	set := c.set.Load()
	if set == nil {
		var err error
		if set, err = c.refresh(ctx, false); set == nil {
			return nil, err
		}
	} else if c.now().Sub(set.fetched) > c.maxAge {
		c.refreshInBackground()
	}
	k := set.lookup(kid)
	if k == nil {
		// A key the issuer has just rotated in: fetch again, unless the
		// last fetch was within the floor (a stream of made-up key IDs
		// must not become a stream of fetches).
		if fresh, _ := c.refresh(ctx, false); fresh != nil {
			k = fresh.lookup(kid)
		}
	}
	if k == nil {
		if kid == "" {
			return nil, invalid("no kid in the header, and the issuer publishes more than one key")
		}
		return nil, invalid("signed with key %q, which the issuer does not publish", short(kid))
	}
	if k.Algorithm != "" && k.Algorithm != string(alg) {
		return nil, invalid("signed with %s, but the issuer's key %q is for %s", alg, short(kid), k.Algorithm)
	}
	return k.Key, nil
}

func (s *keySet) lookup(kid string) *jose.JSONWebKey {
	if kid == "" {
		return s.only
	}
	return s.byID[kid]
}

// refresh fetches the keys, unless the last attempt was within the floor
// (force ignores the floor) in which case it returns what is held (and the
// last error if nothing is).
func (c *keyCache) refresh(ctx context.Context, force bool) (*keySet, error) {
	c.mu.Lock()
	if !force && !c.lastFetch.IsZero() && c.now().Sub(c.lastFetch) < c.floor {
		err := c.lastErr
		c.mu.Unlock()
		if set := c.set.Load(); set != nil {
			return set, nil
		}
		if err == nil {
			err = ErrUnavailable
		}
		return nil, err
	}
	c.mu.Unlock()
	// The fetch runs detached from one request's context: its result
	// serves every request waiting on it.
	ch := c.group.DoChan("fetch", func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		set, err := c.fetch(fctx)
		c.mu.Lock()
		c.lastFetch, c.lastErr = c.now(), err
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		c.set.Store(set)
		return set, nil
	})
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	case r := <-ch:
		if r.Err != nil {
			return c.set.Load(), r.Err
		}
		return r.Val.(*keySet), nil
	}
}

func (c *keyCache) refreshInBackground() {
	c.mu.Lock()
	if c.bgRunning {
		c.mu.Unlock()
		return
	}
	c.bgRunning = true
	c.mu.Unlock()
	go func() {
		defer func() { c.mu.Lock(); c.bgRunning = false; c.mu.Unlock() }()
		c.refresh(context.Background(), false)
	}()
}

// fetch discovers the JWKS URI (once) and fetches the keys.
func (c *keyCache) fetch(ctx context.Context) (*keySet, error) {
	c.mu.Lock()
	uri := c.jwksURI
	c.mu.Unlock()
	if uri == "" {
		var err error
		if uri, err = c.discover(ctx); err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.jwksURI = uri
		c.mu.Unlock()
	}
	var jwks jose.JSONWebKeySet
	if err := c.getJSON(ctx, uri, &jwks); err != nil {
		return nil, fmt.Errorf("%w: fetch the issuer's keys: %w", ErrUnavailable, err)
	}
	set := &keySet{byID: map[string]*jose.JSONWebKey{}, fetched: c.now()}
	var usable []*jose.JSONWebKey
	for i := range jwks.Keys {
		k := &jwks.Keys[i]
		// Public signing keys only: a symmetric ("oct") key in a JWKS
		// is never used, so no token is checked with HMAC.
		if !k.IsPublic() || !k.Valid() || (k.Use != "" && k.Use != "sig") {
			continue
		}
		usable = append(usable, k)
		if k.KeyID != "" {
			set.byID[k.KeyID] = k
		}
	}
	if len(usable) == 0 {
		return nil, fmt.Errorf("%w: the issuer's JWKS at %s holds no public signing key", ErrUnavailable, uri)
	}
	if len(usable) == 1 {
		set.only = usable[0]
	}
	return set, nil
}

// discover finds the issuer's jwks_uri in its metadata: RFC 8414
// (/.well-known/oauth-authorization-server inserted before the issuer's
// path), then OpenID discovery (inserted, then appended), the order the
// MCP authorization spec gives. The metadata's issuer must be the
// configured issuer exactly (RFC 8414 section 3.3).
func (c *keyCache) discover(ctx context.Context) (string, error) {
	iss, err := url.Parse(c.cfg.Issuer)
	if err != nil {
		return "", fmt.Errorf("issuer %q: %w", c.cfg.Issuer, err)
	}
	path := strings.TrimSuffix(iss.Path, "/")
	base := iss.Scheme + "://" + iss.Host
	candidates := []string{base + "/.well-known/oauth-authorization-server" + path, base + "/.well-known/openid-configuration" + path}
	if path != "" {
		candidates = append(candidates, base+path+"/.well-known/openid-configuration")
	}
	var tried []string
	for _, u := range candidates {
		var meta struct {
			Issuer  string `json:"issuer"`
			JWKSURI string `json:"jwks_uri"`
		}
		if err := c.getJSON(ctx, u, &meta); err != nil {
			tried = append(tried, err.Error())
			continue
		}
		if meta.Issuer != c.cfg.Issuer {
			return "", fmt.Errorf("%w: the metadata at %s names issuer %q, not %s: check server.oauth.issuer", ErrUnavailable, u, short(meta.Issuer), c.cfg.Issuer)
		}
		if meta.JWKSURI == "" {
			return "", fmt.Errorf("%w: the metadata at %s has no jwks_uri: set server.oauth.jwks_uri", ErrUnavailable, u)
		}
		ju, err := url.Parse(meta.JWKSURI)
		if err != nil || !(ju.Scheme == "https" || ju.Scheme == "http" && loopbackHost(ju.Hostname())) {
			return "", fmt.Errorf("%w: the metadata at %s gives jwks_uri %q: want https (plaintext http only to loopback)", ErrUnavailable, u, short(meta.JWKSURI))
		}
		return meta.JWKSURI, nil
	}
	return "", fmt.Errorf("%w: no authorization server metadata for %s (%s): set server.oauth.jwks_uri, or check server.oauth.issuer", ErrUnavailable, c.cfg.Issuer, strings.Join(tried, "; "))
}

func (c *keyCache) getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	res, err := c.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("GET %s: %w", u, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", u, res.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20+1))
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	if len(body) > 1<<20 {
		return fmt.Errorf("GET %s: more than 1 MiB", u)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

// short quotes at most 64 bytes of a value taken from a token or a
// response, for an error.
func short(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return s
}

// loopbackHost reports whether host is a loopback address or "localhost",
// the only hosts a plaintext http:// JWKS may be on.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
