package httpfront

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Token maps a bearer token, stored only as its SHA-256 digest, to an agent
// identity.
type Token struct {
	Digest   digest.Digest
	Identity string
}

// TokenDigest is how a bearer token is stored in the configuration.
func TokenDigest(token string) digest.Digest { return digest.Bytes([]byte(token)) }

// TokenSet is the bearer tokens the HTTP front accepts. It is replaced as a
// whole (SIGHUP re-reads server.tokens): every request is authenticated
// against the set in force when it arrives.
type TokenSet struct{ p atomic.Pointer[[]Token] }

// NewTokenSet returns a set holding tokens.
func NewTokenSet(tokens []Token) *TokenSet {
	s := &TokenSet{}
	s.Store(tokens)
	return s
}

// Load returns the tokens in force (do not modify them).
func (s *TokenSet) Load() []Token { return *s.p.Load() }

// Store puts tokens in force for every request that arrives from now on.
func (s *TokenSet) Store(tokens []Token) {
	c := slices.Clone(tokens)
	s.p.Store(&c)
}

// AnonymousIdentity is the identity of every agent when no authentication
// is configured (loopback only).
const AnonymousIdentity = "anonymous"

// oauthRefusal is an OAuth access token the verifier refused (its error
// wraps oauth.ErrInvalidToken, ErrInsufficientScope or ErrUnavailable).
type oauthRefusal struct{ err error }

func (e *oauthRefusal) Error() string { return e.err.Error() }
func (e *oauthRefusal) Unwrap() error { return e.err }

// authenticateAgent returns the identity of the request's agent: as
// authenticate does, then, with o.OAuth, a bearer token that is none of
// the static tokens as an OAuth access token. It also returns the digest
// of a static token that identified the agent (else zero) and the OAuth
// identity and its verified raw access token when an access token did
// (else nil and zero).
func authenticateAgent(r *http.Request, o Options) (string, digest.Digest, *oauth.Identity, credential.Secret, error) {
	who, tok, err := authenticate(r, o)
	var nt *notStaticToken
	if o.OAuth == nil || !errors.As(err, &nt) {
		return who, tok, nil, credential.Secret{}, err
	}
	id, verr := o.OAuth.Verify(r.Context(), nt.token)
	if verr != nil {
		return "", digest.Digest{}, nil, credential.Secret{}, &oauthRefusal{fmt.Errorf("the bearer token is not valid for this gateway: %w", verr)}
	}
	return id.Name, digest.Digest{}, id, credential.NewSecret(nt.token), nil
}

// notStaticToken is a well-formed bearer token that is none of the static
// tokens in force.
type notStaticToken struct{ token string }

func (*notStaticToken) Error() string { return "the bearer token is not valid for this gateway" }

// authenticate returns the identity of the request's agent, checking its
// bearer token against the tokens in force (o.TokenSet, else o.Tokens), and
// the digest of that token (zero when no bearer token identified it). A
// bearer token that is none of them is a *notStaticToken error.
func authenticate(r *http.Request, o Options) (string, digest.Digest, error) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "bearer") || tok == "" {
			return "", digest.Digest{}, errors.New("the Authorization header must be \"Bearer <token>\"")
		}
		got := TokenDigest(strings.TrimSpace(tok))
		who := ""
		inForce := o.Tokens
		if o.TokenSet != nil {
			inForce = o.TokenSet.Load()
		}
		// Compare against every token, in constant time, without an early
		// exit.
		for _, t := range inForce {
			if got.Equal(t.Digest) && who == "" {
				who = t.Identity
			}
		}
		if who == "" {
			return "", digest.Digest{}, &notStaticToken{token: strings.TrimSpace(tok)}
		}
		return who, got, nil
	}
	if o.ClientCerts && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		leaf := r.TLS.VerifiedChains[0][0]
		if emptySubject(leaf.Subject) {
			// The subject is the identity: every certificate without one
			// (SAN-only, as SPIFFE and service meshes issue them) would be
			// the same agent, sharing sessions, policy and audit name.
			return "", digest.Digest{}, &certRefusedError{leaf: leaf, why: "the client certificate's subject is empty (a SAN-only certificate, such as a SPIFFE SVID): cmcp takes the subject DN as the agent identity, and certificates without one cannot be told apart; give the agent a certificate whose subject names it (e.g. CN=agent-7), or a bearer token"}
		}
		id := CertIdentity(leaf.Subject)
		if strings.ContainsFunc(id, unicode.IsControl) {
			// An identity is a name in the log, the policy and replay:
			// one with control characters is refused, not escaped.
			return "", digest.Digest{}, &certRefusedError{leaf: leaf, why: "the client certificate's subject holds control characters; it cannot be an agent identity"}
		}
		return id, digest.Digest{}, nil
	}
	if len(o.Tokens) == 0 && !o.ClientCerts && o.OAuth == nil {
		return AnonymousIdentity, digest.Digest{}, nil
	}
	return "", digest.Digest{}, errors.New("authentication required: send \"Authorization: Bearer <token>\" or a client certificate")
}

// CertIdentity is the identity of a client certificate subject.
func CertIdentity(subject pkix.Name) string { return "cert:" + subject.String() }

// emptySubject reports a subject with no attribute, or only attributes
// with empty values ("CN="): it names no one.
func emptySubject(n pkix.Name) bool {
	atvs := slices.Clone(n.Names)
	for _, rdn := range n.ToRDNSequence() {
		atvs = append(atvs, rdn...)
	}
	for _, a := range atvs {
		if s, ok := a.Value.(string); !ok || s != "" {
			return false
		}
	}
	return true
}

// certRefusedError is a verified client certificate that cannot be an
// agent identity. Unlike a missing or wrong credential it is logged: the
// operator's PKI issued it, and the agent holding it cannot get in until
// the PKI or the gateway changes.
type certRefusedError struct {
	leaf *x509.Certificate
	why  string
}

func (e *certRefusedError) Error() string { return e.why }

// logAttrs describe the certificate to the operator: who issued it and the
// names it does carry.
func (e *certRefusedError) logAttrs() []any {
	uris := make([]string, 0, len(e.leaf.URIs))
	for _, u := range e.leaf.URIs {
		uris = append(uris, u.String())
	}
	serial := ""
	if e.leaf.SerialNumber != nil {
		serial = e.leaf.SerialNumber.Text(16)
	}
	return []any{"reason", e.why, "subject", e.leaf.Subject.String(), "issuer", e.leaf.Issuer.String(), "serial", serial,
		"uri_sans", uris, "dns_sans", e.leaf.DNSNames, "email_sans", e.leaf.EmailAddresses}
}

// everySecond lets a warning through at most once a second and counts the
// ones it held back, so that a client cannot flood the gateway log.
type everySecond struct{ last, quiet atomic.Int64 }

// allow reports whether to log now and how many were held back since the
// last one logged.
func (l *everySecond) allow() (bool, int64) {
	now := time.Now().UnixNano()
	if l0 := l.last.Load(); now-l0 < int64(time.Second) || !l.last.CompareAndSwap(l0, now) {
		l.quiet.Add(1)
		return false, 0
	}
	return true, l.quiet.Swap(0)
}
