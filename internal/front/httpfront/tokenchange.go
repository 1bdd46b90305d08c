package httpfront

import (
	"fmt"
	"slices"
	"strings"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// A TokenChange is what putting another list of bearer tokens in force
// (SIGHUP re-reads server.tokens) changes.
type TokenChange struct {
	// Removed are the identities left without a token, sorted.
	Removed []string
	// NowOf maps each token in force next to its identity: a session
	// opened with a token that no longer maps to its identity ends.
	NowOf map[digest.Digest]string
	// Note says what changed, for the reload's record (never a token).
	Note string
}

// CompareTokens is the change from tokens prev to next, nil if next maps
// the same digests to the same identities, in any order.
func CompareTokens(prev, next []Token) *TokenChange {
	if sameTokens(prev, next) {
		return nil
	}
	c := &TokenChange{NowOf: map[digest.Digest]string{}}
	was, now := identitiesOf(prev), identitiesOf(next)
	for id := range was {
		if !now[id] {
			c.Removed = append(c.Removed, id)
		}
	}
	slices.Sort(c.Removed)
	for _, t := range next {
		c.NowOf[t.Digest] = t.Identity
	}
	withdrawn := 0
	for _, t := range prev {
		if c.NowOf[t.Digest] != t.Identity {
			withdrawn++
		}
	}
	c.Note = fmt.Sprintf("server.tokens: %d tokens for %d identities in force (were %d for %d)", len(next), len(now), len(prev), len(was))
	if withdrawn > 0 {
		c.Note += fmt.Sprintf("; %d tokens withdrawn or moved to another identity, the sessions they opened ended", withdrawn)
	}
	if len(c.Removed) > 0 {
		c.Note += fmt.Sprintf("; identities left without a token, their sessions ended: %s", strings.Join(c.Removed, ", "))
	}
	return c
}

func identitiesOf(ts []Token) map[string]bool {
	out := map[string]bool{}
	for _, t := range ts {
		out[t.Identity] = true
	}
	return out
}

// sameTokens reports whether a and b map the same digests to the same
// identities, in any order.
func sameTokens(a, b []Token) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]string{}
	for _, t := range a {
		m[t.Digest.String()] = t.Identity
	}
	for _, t := range b {
		if id, ok := m[t.Digest.String()]; !ok || id != t.Identity {
			return false
		}
	}
	return true
}
