package oauth

import (
	"sync"
	"time"
)

// tokenCache remembers tokens that verified, by their SHA-256, until they
// expire. It is bounded: when full, expired entries go, and if none had,
// everything does (the next requests verify again).
type tokenCache struct {
	max int
	mu  sync.RWMutex
	m   map[[32]byte]cachedToken
}

type cachedToken struct {
	id  *Identity
	kid string
}

func newTokenCache(max int) *tokenCache {
	return &tokenCache{max: max, m: make(map[[32]byte]cachedToken)}
}

// get returns the identity of a token seen before, unless it expired
// before notBefore (now less the skew) or its key is no longer in keys.
func (c *tokenCache) get(sum [32]byte, notBefore time.Time, keys *keySet) (*Identity, bool) {
	c.mu.RLock()
	e, ok := c.m[sum]
	c.mu.RUnlock()
	if !ok {
		return nil, false
	}
	if !e.id.Expiry.After(notBefore) || keys == nil || keys.lookup(e.kid) == nil {
		c.mu.Lock()
		delete(c.m, sum)
		c.mu.Unlock()
		return nil, false
	}
	return e.id, true
}

func (c *tokenCache) put(sum [32]byte, id *Identity, kid string, notBefore time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		for k, e := range c.m {
			if !e.id.Expiry.After(notBefore) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= c.max {
			clear(c.m)
		}
	}
	c.m[sum] = cachedToken{id: id, kid: kid}
}
