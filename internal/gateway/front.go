package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/sessionbounds"
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

// HTTPOptions configures the Streamable HTTP front end.
type HTTPOptions struct {
	// Tokens are the accepted bearer tokens at start. Empty (and no client
	// certificates): development mode, every request is AnonymousIdentity;
	// CheckListen then allows loopback addresses only. They fix the mode
	// for the handler's life: a TokenSet emptied later accepts no token,
	// it does not switch to development mode.
	Tokens []Token
	// TokenSet, if set, holds the tokens in force (replaced on SIGHUP);
	// nil: Tokens, for good.
	TokenSet *TokenSet
	// OAuth, if set, accepts OAuth 2.1 access tokens (server.oauth) beside
	// Tokens: a bearer token that is none of Tokens is verified by it, and
	// refused requests get its WWW-Authenticate challenge.
	OAuth *oauth.Verifier
	// ClientCerts accepts a verified TLS client certificate (mutual TLS) as
	// authentication; its subject is the identity, and one with an empty
	// subject (SAN-only) is refused.
	ClientCerts bool
	// SessionTimeout ends sessions idle for this long, stopping their
	// children (0: 10 minutes; negative: never).
	SessionTimeout time.Duration
	// MaxRequestBytes bounds a request body; larger ones get 413 (0: 4 MiB).
	MaxRequestBytes int64
	// BodyTimeout bounds how long a POST's body may take to arrive; a
	// slower one gets 408 (0: 1 minute). The long-lived GET streams have
	// no body and are not affected.
	BodyTimeout time.Duration
	// WriteStallTimeout bounds how long writing a POST's response may make
	// no progress (0: the gateway's call timeout, server.call_timeout): an
	// answer the agent does not read is given up then, the connection
	// closed, and the request is over, so that its session can become
	// idle and end. The answer is written in pieces of writeStallChunk
	// bytes, each of which must be taken by the connection within the
	// bound: a slow reader that keeps reading is not cut, provided the
	// connection queues little unsent (LowWatermarkListener: without it
	// the kernel takes more of an answer only once a third of a send
	// buffer of several MiB has drained). GET streams are not bounded.
	WriteStallTimeout time.Duration
	// MaxSessions bounds the open sessions; past it a request that would
	// open one gets 503 (0: sessionbounds.DefaultTotal).
	MaxSessions int
	// MaxSessionsPerAgent bounds one identity's open sessions; past it a
	// request of that identity that would open one gets 429 (0:
	// sessionbounds.DefaultPerAgent, or MaxSessions if that is less).
	MaxSessionsPerAgent int
}

// AnonymousIdentity is the identity of every agent when no authentication
// is configured (loopback only).
const AnonymousIdentity = "anonymous"

type sessCtxKey struct{}

// HTTPHandler returns the agent-facing MCP endpoint (mount it at /mcp): it
// authenticates every request, binds each session to the identity that
// opened it, and serves MCP over Streamable HTTP with idle-session reaping,
// DNS-rebinding protection and a request size limit.
func (g *Gateway) HTTPHandler(o HTTPOptions) http.Handler {
	timeout := o.SessionTimeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	if timeout < 0 {
		timeout = 0
	}
	maxBytes := o.MaxRequestBytes
	if maxBytes <= 0 {
		maxBytes = 4 << 20
	}
	bodyTimeout := o.BodyTimeout
	if bodyTimeout <= 0 {
		bodyTimeout = time.Minute
	}
	if o.TokenSet == nil {
		o.TokenSet = NewTokenSet(o.Tokens)
	}
	stall := o.WriteStallTimeout
	if stall <= 0 {
		stall = g.opts.CallTimeout
	}
	maxSessions, maxPerAgent := sessionbounds.Resolve(o.MaxSessions, o.MaxSessionsPerAgent)
	g.spareBound.Store(int64(maxSessions)) // warm spares count in it (spares.go)
	g.fillSpares()
	// Unset, the bound per agent is the bound in all when that is below
	// the default (sessionbounds.Resolve): then raising
	// server.max_sessions raises it. At or above the default it is the
	// default, which only server.max_sessions_per_agent raises.
	perAgentInherited := sessionbounds.PerAgentInherited(o.MaxSessions, o.MaxSessionsPerAgent)
	idleEnd := fmt.Sprintf("idle ones end after %s, server.session_timeout", timeout)
	if timeout == 0 {
		idleEnd = "idle ones do not end: server.session_timeout is off"
	}
	var sessionWarn everySecond
	probe := mcp.NewServer(&mcp.Implementation{Name: g.opts.Name, Version: g.opts.Version}, nil)
	sdk := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		if s, ok := r.Context().Value(sessCtxKey{}).(*session); ok {
			return s.srv
		}
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			if s := g.sessionByID(id); s != nil {
				return s.srv
			}
		}
		return probe
	}, &mcp.StreamableHTTPOptions{
		// The gateway times idle sessions out itself (reapIdle): go-sdk
		// never sees the calls the fast path answers.
		MaxRequestBodyBytes: maxBytes,
		Logger:              g.logger,
	})
	if timeout > 0 {
		go g.reapIdle(timeout)
	}
	var certWarn everySecond
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body is bounded before anything else, refused requests
		// included: the limit counts the whole body, the white space
		// refuseBatch skips included (go-sdk's limit and the fast path's
		// count only what is left after it). And it must arrive in time,
		// or an endless one would hold the connection (a client without
		// credentials included), the session busy (never reaped) and
		// shutdown waiting. Once the body is read to its end the server
		// clears the deadline, so a long call is not cut off; GET
		// streams have no body and no deadline.
		if r.ContentLength != 0 {
			r.Body = http.MaxBytesReader(w, r.Body, maxBytes)
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyTimeout))
		}
		// DNS-rebinding protection, go-sdk's rule, checked here for every
		// request because the fast path never reaches go-sdk.
		if rebound(r) {
			refuseUnread(w, r, http.StatusForbidden, fmt.Sprintf("cmcp: forbidden: invalid Host header %q: a gateway listening on a loopback address answers only requests addressed to a loopback host (DNS-rebinding protection)", r.Host))
			return
		}
		who, tok, authID, rawToken, err := authenticateAgent(r, o)
		if err != nil {
			var ce *certRefusedError
			if errors.As(err, &ce) {
				if ok, quiet := certWarn.allow(); ok {
					g.logger.Warn("refused a verified client certificate (401)", append(ce.logAttrs(), "refused_since_last_warning", quiet)...)
				}
			}
			status := http.StatusUnauthorized
			if o.OAuth != nil {
				// RFC 6750 and RFC 9728: the challenge names the
				// resource metadata, and the error when a token was
				// judged (none for a request without one).
				var oe *oauthRefusal
				var judged error
				if errors.As(err, &oe) {
					judged = oe.err
				}
				status = o.OAuth.Challenge(w.Header(), judged)
			} else {
				w.Header().Set("WWW-Authenticate", `Bearer realm="cmcp"`)
			}
			refuseUnread(w, r, status, "cmcp: "+err.Error())
			return
		}
		if r.Method == http.MethodPost && refuseBatch(w, r) {
			return
		}
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			s := g.sessionByID(id)
			if s != nil && s.principal != who {
				refuseUnread(w, r, http.StatusForbidden, "cmcp: this session belongs to another identity; open your own session")
				return
			}
			if s != nil {
				s.authedWith(authID, rawToken)
			}
			if s != nil && r.Method == http.MethodGet {
				s.streamOpenedWith(tok)
			}
			if s != nil && r.Method == http.MethodDelete {
				// go-sdk's DELETE closes the session at once, which holds
				// until the requests go-sdk answers are done and then
				// drops their answers: the session's calls are cut and
				// answered first. Cut, it ends even if go-sdk refuses the
				// DELETE.
				s.cutAndAnswer(endedFor(whyDeleted))
				defer func() { go s.end(endedFor(whyDeleted)) }()
			}
			if s != nil && r.Method == http.MethodPost {
				s.posts.Add(1)
				defer func() {
					s.lastPost.Store(time.Now().UnixNano())
					s.posts.Add(-1)
				}()
				sw := newStallWriter(w, stall)
				defer sw.finish()
				w = sw
				if s.httpFast(w, r, maxBytes) {
					return
				}
			}
		} else if r.Method == http.MethodPost {
			if g.closing.Load() {
				refuseUnread(w, r, http.StatusServiceUnavailable, "cmcp: the gateway is shutting down")
				return
			}
			release, limit, open := g.slots.take(who, maxSessions, maxPerAgent)
			if release == nil {
				g.refuseSession(w, r, who, limit, open, idleEnd, perAgentInherited, &sessionWarn)
				return
			}
			if refuseWithoutSession(w, r) {
				release()
				return
			}
			s := g.newSession(who, "http")
			s.token, s.releaseSlot = tok, release
			s.authedWith(authID, rawToken)
			r = r.WithContext(context.WithValue(r.Context(), sessCtxKey{}, s))
			// A request that opened no session (not an initialize, or
			// one that failed) gives its slot back; a session gives it
			// back when it ends.
			defer func() {
				if s.downSession() == nil {
					release()
				}
			}()
			sw := newStallWriter(w, stall)
			defer sw.finish()
			w = sw
		}
		sdk.ServeHTTP(w, r)
	})
}

// refuseWithoutSession answers a POST without Mcp-Session-Id whose message
// is not an initialize request: HTTP 400 (the Streamable HTTP transport's
// answer to a request without its session) with JSON-RPC -32600 and the
// request's id, instead of go-sdk's HTTP 200 with a JSON-RPC error of code
// 0. Anything it cannot read is left to go-sdk, body unchanged.
func refuseWithoutSession(w http.ResponseWriter, r *http.Request) bool {
	body, err := io.ReadAll(r.Body)
	rest := r.Body
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	if err != nil {
		return false
	}
	msg, err := rpcwire.DecodeMessage(body)
	if err != nil {
		return false
	}
	var id jsonrpc.ID
	switch m := msg.(type) {
	case *jsonrpc.Request:
		if m.Method == "initialize" {
			return false
		}
		id = m.ID
	case *jsonrpc.Response:
	default:
		return false
	}
	writeRPCError(w, http.StatusBadRequest, id, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest,
		Message: "cmcp: missing Mcp-Session-Id header: every request but initialize must carry the session id that the answer to initialize gave (MCP Streamable HTTP); send initialize first"})
	return true
}

// writeStallChunk is the most a single write of a POST's response puts
// on the connection under one deadline.
const writeStallChunk = 16 << 10

// stallWriter bounds the writes of one POST's response: before every
// piece of at most writeStallChunk bytes, and every flush, the connection's
// write deadline is set limit ahead, so a write fails once the agent has
// read nothing for that long (http.Server has no WriteTimeout: it would
// cut GET streams and long calls). Between writes a past deadline does
// no harm: the next write sets a new one. finish sets it once more for
// what net/http writes after the handler (the rest of the buffer, the
// last chunk), and the server clears it for the next request.
type stallWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	limit time.Duration
	// failed is why a write failed, if one did (read by the fast path,
	// whose result record says the answer was not delivered).
	failed string
}

func newStallWriter(w http.ResponseWriter, limit time.Duration) *stallWriter {
	return &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), limit: limit}
}

func (w *stallWriter) arm() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.limit)) }

func (w *stallWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), writeStallChunk)
		w.arm()
		m, err := w.ResponseWriter.Write(p[:c])
		n += m
		if err != nil {
			w.fail(err)
			return n, err
		}
		p = p[c:]
	}
	return n, nil
}

// FlushError is the flush http.ResponseController uses.
func (w *stallWriter) FlushError() error {
	w.arm()
	err := w.rc.Flush()
	if err != nil {
		w.fail(err)
	}
	return err
}

func (w *stallWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the connection's other
// controls (the read deadline).
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *stallWriter) fail(err error) {
	if w.failed != "" {
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		w.failed = fmt.Sprintf("the agent read nothing of it for %s, and its connection was closed", w.limit)
		return
	}
	w.failed = fmt.Sprintf("writing it to the agent failed: %v", err)
}

func (w *stallWriter) finish() { w.arm() }

// undelivered is why w could not deliver a response, or "" (w is not a
// stallWriter, or every write succeeded).
func undelivered(w http.ResponseWriter) string {
	if sw, ok := w.(*stallWriter); ok {
		return sw.failed
	}
	return ""
}

// rebound reports a request that reached a loopback listener under a
// non-loopback Host: a web page's script using DNS rebinding.
func rebound(r *http.Request) bool {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return ok && la != nil && isLoopbackAddr(la.String()) && !isLoopbackAddr(r.Host)
}

// isLoopbackAddr is go-sdk's loopback test for a host or host:port.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// reapIdle ends HTTP sessions that had no POST in progress for longer than
// timeout (go-sdk's rule: a standalone GET stream does not keep a session
// alive), stopping their children.
func (g *Gateway) reapIdle(timeout time.Duration) {
	t := time.NewTicker(min(max(timeout/4, 10*time.Millisecond), 30*time.Second))
	defer t.Stop()
	for range t.C {
		if g.closing.Load() {
			return
		}
		cutoff := time.Now().Add(-timeout).UnixNano()
		for _, s := range g.sessionList() {
			if s.front == "http" && s.posts.Load() == 0 && s.lastPost.Load() < cutoff {
				go s.end(endedFor(fmt.Sprintf("idle for longer than the session timeout (%s)", timeout)))
			}
		}
	}
}

// refuseBatch answers a POST whose body is a JSON array (a JSON-RPC batch)
// with 400 and a JSON-RPC error, and reports whether it did. go-sdk still
// accepts batches from clients that send no protocol version (it assumes
// 2025-03-26, where batches existed); cmcp refuses them for every version, as
// its stdio front and pkg/framing do, so one request is always one call with
// one audit record. Leading white space is consumed; the rest of the body is
// passed on untouched. White space alone past the body's limit (r.Body is
// an http.MaxBytesReader) is answered 413, and white space that keeps
// arriving past the read deadline 408.
func refuseBatch(w http.ResponseWriter, r *http.Request) bool {
	br := bufio.NewReaderSize(r.Body, 64)
	for {
		b, err := br.ReadByte()
		if err != nil {
			var mbe *http.MaxBytesError
			switch {
			case errors.As(err, &mbe):
				refuseBody(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("cmcp: the request body exceeds %d bytes (server.max_request_bytes)", mbe.Limit))
				return true
			case errors.Is(err, os.ErrDeadlineExceeded):
				refuseBody(w, r, http.StatusRequestTimeout, "cmcp: the request body did not arrive in time")
				return true
			}
			break
		}
		switch b {
		case ' ', '\t', '\r', '\n':
			continue
		case '[':
			refuseBody(w, r, http.StatusBadRequest, "cmcp: JSON-RPC batches are refused: send one request per POST (MCP 2025-06-18 and later have no batches)")
			return true
		}
		_ = br.UnreadByte()
		break
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{br, r.Body}
	return false
}

// refuseUnread answers, in plain text, a request the gateway refuses
// without reading its body.
func refuseUnread(w http.ResponseWriter, r *http.Request, status int, msg string) {
	dropBody(w, r)
	http.Error(w, msg, status)
}

// refuseBody answers a POST whose body is refused with status and a
// JSON-RPC error (Invalid Request) saying why.
func refuseBody(w http.ResponseWriter, r *http.Request, status int, why string) {
	dropBody(w, r)
	b, _ := json.Marshal(why)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":%s}}`+"\n", -32600, b)
}

// dropBody gives up the rest of a refused request's body. Left unread,
// net/http would read it to its end (up to 256 KiB) before the answer is
// even written, at whatever pace the client sends it: instead the
// connection is closed after the answer (HTTP/1; HTTP/2 reads nothing) and
// reads on it end now. Call it before the answer is written.
//
// It is closed as net/http closes one whose body went past a
// MaxBytesReader's limit (a refused request's is 0 bytes): the answer
// sent, the sending side shut, the socket closed half a second later.
// Closed at once with unread bytes in it, the kernel sends a reset that
// can overtake the answer: a client still sending its body (a large call
// with a rotated token) got a transport error, not its 401. net/http
// lingers on its own only if r.Body is still its own body (here it is a
// MaxBytesReader from the start), more than 256 KiB of it are left, and
// the client did not send Connection: close.
func dropBody(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 {
		return
	}
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
		_, _ = http.MaxBytesReader(w, io.NopCloser(strings.NewReader("-")), 0).Read(make([]byte, 1))
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

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
func authenticateAgent(r *http.Request, o HTTPOptions) (string, digest.Digest, *oauth.Identity, credential.Secret, error) {
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
func authenticate(r *http.Request, o HTTPOptions) (string, digest.Digest, error) {
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

func (g *Gateway) sessionByID(id string) *session {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byID[id]
}

// ServeStdio serves one agent session over in and out (cmcp serve --stdio:
// the agent spawned cmcp). It returns when the agent has closed its end
// (in ended) and every request it sent is answered, or when ctx ends,
// after the session's children are stopped.
func (g *Gateway) ServeStdio(ctx context.Context, in io.ReadCloser, out io.WriteCloser, identity string) error {
	return g.serveStdio(ctx, in, out, identity, nil)
}

// serveStdio is ServeStdio; inputEnded, if set, is called once in ends,
// while the requests read are still being answered (server.Serve bounds that
// by server.shutdown_grace).
func (g *Gateway) serveStdio(ctx context.Context, in io.ReadCloser, out io.WriteCloser, identity string, inputEnded func()) error {
	if identity == "" {
		identity = AnonymousIdentity
	}
	s := g.newSession(identity, "stdio")
	err := s.srv.Run(ctx, &stdiofront.Transport{In: in, Out: out, Fast: s.stdioFast, Passed: s.recordUndecodableCall, BadID: s.recordBadIDCall,
		Ambiguous: s.refuseAmbiguousCall, Unanswered: &s.unanswered, InputEnded: inputEnded, AgentReqs: &s.agentReqs})
	s.end(endedFor("the agent closed the stdio connection"))
	if err != nil && (errors.Is(err, io.EOF) || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}
