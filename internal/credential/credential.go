// Package credential mints the credential an HTTP upstream is called with
// for each calling identity, so that every person or agent acts upstream as
// itself and never as one shared account. A Source mints (an exec helper,
// OAuth client credentials, RFC 8693 token exchange, or the authorization
// code grant of the upstream's own authorization server); a Broker keeps
// what was minted in a bounded LRU cache keyed by (identity, upstream),
// refreshes it before it expires, mints once for a burst of first calls
// (singleflight) and forgets the identities whose tokens were revoked; a
// Transport puts the credential on every request of one identity's
// connection and tells a propagation race (401 on a credential the upstream
// never accepted yet: retry with backoff) from a revocation (401 on one it
// accepted before: drop, mint once more, at once).
//
// Credentials are Secret values: they format as "[redacted]" and never
// reach a log line, an audit record, an error message, a child's
// environment or a metric label. What is recorded about one is its source,
// its expiry and a keyed fingerprint (Fingerprint).
package credential

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"
)

// Secret is a credential (a token, a client secret, a refresh token, the
// agent's own token used as a subject token). It prints as "[redacted]"
// with every fmt verb, in slog and in JSON: only Reveal gives its value.
type Secret struct{ v string }

// NewSecret wraps s.
func NewSecret(s string) Secret { return Secret{v: s} }

// Reveal is the secret's value, to put on the wire and nowhere else.
func (s Secret) Reveal() string { return s.v }

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.v == "" }

// Format prints "[redacted]" whatever the verb.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte("[redacted]")) }

// LogValue keeps the secret out of slog output.
func (s Secret) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// MarshalJSON keeps the secret out of JSON output.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"[redacted]"`), nil }

// MarshalText keeps the secret out of text encodings (YAML, map keys).
func (s Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// Identity is the canonical identity a credential is minted for: the
// gateway's authenticated agent (a static token's agent name, or the
// verified OAuth identity), its groups, and, for token exchange only, the
// agent's own verified token. That token is a subject token for the
// exchange and nothing else: it is never sent to an upstream.
type Identity struct {
	// Name is the canonical identity (the Cedar principal's id).
	Name string
	// Groups are the identity's groups (Cedar Group parents), sorted.
	Groups []string
	// Token is the agent's own verified access token (zero for a static
	// token's agent); token_exchange uses it as the subject token.
	Token Secret
}

// Token is what a Source minted: the credential and when it expires (zero
// when the source does not say; it is then used until the upstream
// refuses it or the identity is forgotten).
type Token struct {
	Value  Secret
	Expiry time.Time
}

// Request is what a Source mints for.
type Request struct {
	Identity Identity
	// Upstream is the upstream's configured name.
	Upstream string
	// Audience is the configured audience of the credential (the
	// upstream's resource URL unless configured otherwise).
	Audience string
}

// Source mints credentials.
type Source interface {
	// Kind is the configured source name: exec, client_credentials,
	// token_exchange or authorization_code.
	Kind() string
	// Mint returns a new credential for r. Errors name the upstream and
	// the identity, and never hold a credential.
	Mint(ctx context.Context, r Request) (Token, error)
}

// Shared is implemented by a Source whose credential is the same for every
// identity (client_credentials: one service identity). The Broker then
// keeps one cache entry for all of them.
type Shared interface {
	SharedIdentity() string
}

// fingerprintKey keys the fingerprints of this process: a fingerprint tells
// two credentials apart in one gateway's records, and, keyed, gives nothing
// to guess a short credential from.
var fingerprintKey = func() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic("credential: no randomness for the fingerprint key: " + err.Error())
	}
	return k
}()

// Fingerprint is "hmac-sha256:" and the first 12 bytes, in hex, of the
// HMAC-SHA-256 of the credential under a key this process drew at start:
// equal credentials have equal fingerprints within one gateway run, and a
// fingerprint reveals nothing about the credential.
func Fingerprint(s Secret) string {
	m := hmac.New(sha256.New, fingerprintKey)
	m.Write([]byte(s.v))
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil)[:12])
}
