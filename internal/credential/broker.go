package credential

import (
	"container/list"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// Defaults of Options.
const (
	DefaultCacheSize    = 1024
	DefaultRefreshSkew  = 60 * time.Second
	DefaultAttempts     = 6
	DefaultInitialDelay = 250 * time.Millisecond
	DefaultMaxDelay     = 8 * time.Second
)

// Options tune a Broker. Zero values take the defaults.
type Options struct {
	// Audience goes to the source with every request (Request.Audience).
	Audience string
	// CacheSize bounds the identities whose credential is kept (LRU).
	CacheSize int
	// RefreshSkew: a credential that expires within it is minted again
	// before it is used.
	RefreshSkew time.Duration
	// Retry is the backoff for a 401 on a credential the upstream never
	// accepted yet (a propagation race).
	Retry Retry
	// OnMint is called after every successful mint (for the audit log's
	// credential_minted record). It must not block for long.
	OnMint func(Minted)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Retry is the exponential backoff for a 401 on a fresh credential:
// Attempts retries, the first after Initial, each next one after twice as
// long, at most Max.
type Retry struct {
	Attempts int
	Initial  time.Duration
	Max      time.Duration
}

// delay is the wait before retry i (0-based).
func (r Retry) delay(i int) time.Duration {
	d := r.Initial
	for ; i > 0 && d < r.Max; i-- {
		d *= 2
	}
	return min(d, r.Max)
}

// Minted says who got a new credential, when, from which source, until
// when, and which one (its fingerprint). It never holds the credential.
type Minted struct {
	Upstream    string
	Identity    string
	Source      string
	Reason      string // "first", "expiring" or "refused" (the upstream refused the previous one)
	At          time.Time
	Expiry      time.Time // zero: the source did not say
	Fingerprint string
}

// Credential is one minted credential in the cache.
type Credential struct {
	token       Secret
	auth        []string // {"Bearer <token>"}, shared by every request: never modified
	expiry      time.Time
	fingerprint string
	// accepted is set once the upstream answered a request that carried
	// it with anything but 401: a later 401 means it was revoked, while a
	// 401 before means the upstream has not seen it yet.
	accepted atomic.Bool
}

// Fingerprint is the credential's fingerprint (see Fingerprint).
func (c *Credential) Fingerprint() string { return c.fingerprint }

// Expiry is when the credential expires (zero: not known).
func (c *Credential) Expiry() time.Time { return c.expiry }

// Accepted reports whether the upstream accepted it at least once.
func (c *Credential) Accepted() bool { return c.accepted.Load() }

// Broker mints, caches and refreshes the credentials of one upstream.
type Broker struct {
	upstream string
	src      Source
	shared   string // the one cache key of a Shared source
	isShared bool
	opts     Options
	sf       singleflight.Group

	mu    sync.Mutex
	lru   *list.List // of *entry, most recently used first
	byKey map[string]*list.Element
	mints atomic.Int64
}

type entry struct {
	key  string
	cred *Credential
}

// NewBroker returns a broker for upstream that mints with src.
func NewBroker(upstream string, src Source, o Options) *Broker {
	if o.CacheSize <= 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.RefreshSkew <= 0 {
		o.RefreshSkew = DefaultRefreshSkew
	}
	if o.Retry.Attempts <= 0 {
		o.Retry.Attempts = DefaultAttempts
	}
	if o.Retry.Initial <= 0 {
		o.Retry.Initial = DefaultInitialDelay
	}
	if o.Retry.Max <= 0 {
		o.Retry.Max = DefaultMaxDelay
	}
	if o.Retry.Max < o.Retry.Initial {
		o.Retry.Max = o.Retry.Initial
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	b := &Broker{upstream: upstream, src: src, opts: o, lru: list.New(), byKey: map[string]*list.Element{}}
	if s, ok := src.(Shared); ok {
		b.shared, b.isShared = s.SharedIdentity(), true
	}
	return b
}

// SourceImpl is the broker's source (the gateway mounts an
// *AuthorizationCode's Handler).
func (b *Broker) SourceImpl() Source { return b.src }

// UseUpstreamClient gives an OAuth source the upstream's own (pinned)
// client, for discovering its authorization server from its 401.
func (b *Broker) UseUpstreamClient(hc *http.Client) {
	var c *OAuthClient
	switch s := b.src.(type) {
	case *AuthorizationCode:
		c = s.Client
	case *TokenExchange:
		c = s.Client
	case *ClientCredentials:
		c = s.Client
	}
	if c != nil && c.UpstreamHTTP == nil {
		c.UpstreamHTTP = hc
	}
}

// forgetGrants drops the grants of an authorization_code source.
func (b *Broker) forgetGrants(names []string) {
	if s, ok := b.src.(*AuthorizationCode); ok {
		s.Forget(names...)
	}
}

// PerIdentity reports whether the source mints a credential for each
// identity (all but client_credentials).
func (b *Broker) PerIdentity() bool { return !b.isShared }

// Upstream is the upstream's name.
func (b *Broker) Upstream() string { return b.upstream }

// Source is the source's kind.
func (b *Broker) Source() string { return b.src.Kind() }

// Mints is how many credentials the broker minted so far.
func (b *Broker) Mints() int64 { return b.mints.Load() }

// Len is how many identities have a credential in the cache.
func (b *Broker) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lru.Len()
}

func (b *Broker) key(id Identity) string {
	if b.isShared {
		return b.shared
	}
	return id.Name
}

// Get returns id's credential: the cached one unless it expires within
// the refresh skew, else a new one. Concurrent Gets for one identity that
// have to mint share one mint.
func (b *Broker) Get(ctx context.Context, id Identity) (*Credential, error) {
	if id.Name == "" && !b.isShared {
		return nil, fmt.Errorf("upstream %q: no identity to mint a %s credential for (the caller is not authenticated)", b.upstream, b.src.Kind())
	}
	key := b.key(id)
	if c := b.cached(key); c != nil {
		return c, nil
	}
	return b.mint(ctx, id, key, nil)
}

// cached returns key's credential if it is good for longer than the skew.
func (b *Broker) cached(key string) *Credential {
	b.mu.Lock()
	defer b.mu.Unlock()
	el := b.byKey[key]
	if el == nil {
		return nil
	}
	c := el.Value.(*entry).cred
	if !c.expiry.IsZero() && !b.opts.Now().Add(b.opts.RefreshSkew).Before(c.expiry) {
		return nil
	}
	b.lru.MoveToFront(el)
	return c
}

// mint mints a credential for id, once for all concurrent callers with the
// same key; refused is the credential the upstream refused (nil if none),
// which is not handed out again.
func (b *Broker) mint(ctx context.Context, id Identity, key string, refused *Credential) (*Credential, error) {
	ch := b.sf.DoChan(key, func() (any, error) {
		// One that finished just before may have minted already.
		b.mu.Lock()
		var prev *Credential
		if el := b.byKey[key]; el != nil {
			prev = el.Value.(*entry).cred
		}
		b.mu.Unlock()
		if prev != nil && prev != refused && (prev.expiry.IsZero() || b.opts.Now().Add(b.opts.RefreshSkew).Before(prev.expiry)) {
			return prev, nil
		}
		reason := "first"
		switch {
		case refused != nil:
			reason = "refused"
		case prev != nil:
			reason = "expiring"
		}
		// Not the caller's context: the mint serves every caller
		// waiting on it, and one leaving must not fail the others.
		mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), mintTimeout)
		defer cancel()
		tok, err := b.src.Mint(mctx, Request{Identity: id, Upstream: b.upstream, Audience: b.opts.Audience})
		if err != nil {
			if prev != nil && prev != refused && refused == nil && (prev.expiry.IsZero() || b.opts.Now().Before(prev.expiry)) {
				return prev, nil // not expired yet: used while the source is down
			}
			return nil, err
		}
		if tok.Value.IsZero() {
			return nil, fmt.Errorf("upstream %q: the %s source returned an empty credential for %q", b.upstream, b.src.Kind(), id.Name)
		}
		c := &Credential{token: tok.Value, auth: []string{"Bearer " + tok.Value.v}, expiry: tok.Expiry, fingerprint: Fingerprint(tok.Value)}
		if prev != nil && prev.accepted.Load() && subtle.ConstantTimeCompare([]byte(prev.token.v), []byte(c.token.v)) == 1 {
			// The source gave the same credential again: the upstream
			// accepted it before.
			c.accepted.Store(true)
		}
		b.mints.Add(1)
		b.store(key, c)
		if b.opts.OnMint != nil {
			who := id.Name
			if b.isShared {
				who = b.shared
			}
			b.opts.OnMint(Minted{Upstream: b.upstream, Identity: who, Source: b.src.Kind(), Reason: reason,
				At: b.opts.Now().UTC(), Expiry: tok.Expiry, Fingerprint: c.fingerprint})
		}
		return c, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*Credential), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("upstream %q: waiting for a credential for %q: %w", b.upstream, id.Name, ctx.Err())
	}
}

// mintTimeout bounds one mint (a source has its own, shorter bounds too).
const mintTimeout = 2 * time.Minute

func (b *Broker) store(key string, c *Credential) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if el := b.byKey[key]; el != nil {
		el.Value.(*entry).cred = c
		b.lru.MoveToFront(el)
		return
	}
	b.byKey[key] = b.lru.PushFront(&entry{key: key, cred: c})
	for b.lru.Len() > b.opts.CacheSize {
		last := b.lru.Back()
		b.lru.Remove(last)
		delete(b.byKey, last.Value.(*entry).key)
	}
}

// Refused drops c, which the upstream refused, and mints id a new
// credential at once (once for every caller that saw c refused).
func (b *Broker) Refused(ctx context.Context, id Identity, c *Credential) (*Credential, error) {
	key := b.key(id)
	b.mu.Lock()
	if el := b.byKey[key]; el != nil && el.Value.(*entry).cred == c {
		b.lru.Remove(el)
		delete(b.byKey, key)
	}
	b.mu.Unlock()
	return b.mint(ctx, id, key, c)
}

// Forget drops the credentials of the identities named (their tokens were
// revoked: a reload removed them); it returns how many it dropped.
func (b *Broker) Forget(names ...string) int {
	b.forgetGrants(names)
	if b.isShared {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, name := range names {
		if el := b.byKey[name]; el != nil {
			b.lru.Remove(el)
			delete(b.byKey, name)
			n++
		}
	}
	return n
}

// Keep drops the credentials of every identity keep says no to; it
// returns how many it dropped.
func (b *Broker) Keep(keep func(identity string) bool) int {
	if b.isShared {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for key, el := range b.byKey {
		if !keep(key) {
			b.lru.Remove(el)
			delete(b.byKey, key)
			n++
		}
	}
	return n
}

// ErrRefused is wrapped by the error of a call whose credential the
// upstream refused for good.
var ErrRefused = errors.New("the upstream refused the credential")
