// Package httpfront is the Streamable HTTP front of cmcp serve: the
// agent-facing MCP endpoint (/mcp). It bounds and checks every request
// (body size and arrival time, DNS rebinding, batches), authenticates the
// agent (bearer tokens, mutual TLS, OAuth 2.1 access tokens as a resource
// server), holds each session to the identity that opened it and to the
// session bounds, and answers tools/call itself on its fast path (an SSE
// stream with the call's related messages, then the response); everything
// else goes to go-sdk's Streamable HTTP handler. It speaks to the gateway
// core only through the Core and Session interfaces, which the core
// implements (gateway.(*Gateway).HTTPCore).
package httpfront

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/internal/oauth"
	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/sessionbounds"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Options configures the Streamable HTTP front end.
type Options struct {
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

// CodeTooManySessions is the JSON-RPC error code of a request refused
// because a session bound is reached (HTTP 429 for the agent's own bound,
// 503 for the gateway's); gateway.CodeTooManySessions is this code.
const CodeTooManySessions = -32069

// Which bound refused a session (Core.TakeSlot): the metric's limit label.
const (
	LimitTotal    = sessionbounds.LimitTotal
	LimitPerAgent = sessionbounds.LimitPerAgent
)

// Core is the gateway core as the HTTP front uses it.
type Core interface {
	// Implementation names the gateway to an agent whose request belongs
	// to no session.
	Implementation() *mcp.Implementation
	// Logger is the gateway's log.
	Logger() *slog.Logger
	// CallTimeout is server.call_timeout (WriteStallTimeout's default).
	CallTimeout() time.Duration
	// Draining reports that the gateway is shutting down: no session opens.
	Draining() bool
	// ProtocolVersions are the MCP versions the sessions offer.
	ProtocolVersions() []string
	// SessionBound puts the bound on open sessions in force (warm spares
	// count in it).
	SessionBound(maxSessions int)
	// TakeSlot reserves a place for a new session of who under the
	// bounds and returns the function that gives it back; nil, and the
	// bound reached (LimitTotal, LimitPerAgent) with how many sessions
	// hold it, when there is none.
	TakeSlot(who string, maxSessions, maxPerAgent int) (release func(), limit string, open int)
	// SessionRefused counts a session refused at limit
	// (cmcp_sessions_refused_total).
	SessionRefused(limit string)
	// OpenSession starts a session of who, opened with the bearer token
	// whose digest is tok (zero: none), which gives its place back
	// (release) when it ends.
	OpenSession(who string, tok digest.Digest, release func()) Session
	// Session is the open session whose Mcp-Session-Id is id, or nil.
	Session(id string) Session
	// ReapIdle ends sessions that had no POST in progress for longer than
	// timeout, until the gateway shuts down.
	ReapIdle(timeout time.Duration)
}

// Session is one agent session of the core, as the HTTP front uses it.
type Session interface {
	// Server is the session's go-sdk server.
	Server() *mcp.Server
	// Principal is the identity that opened the session.
	Principal() string
	// Initialized reports that the session's initialize succeeded.
	Initialized() bool
	// AuthedWith notes the credential of the session's latest request:
	// the OAuth identity and raw access token (nil, zero: none).
	AuthedWith(id *oauth.Identity, token credential.Secret)
	// StreamOpenedWith notes the bearer token (digest) that opened a GET
	// stream of the session.
	StreamOpenedWith(tok digest.Digest)
	// PostBegan notes a POST in progress until done is called (an idle
	// session ends).
	PostBegan() (done func())
	// Delete cuts the session's calls and answers them (the agent's HTTP
	// DELETE); end ends the session.
	Delete() (end func())
	// Context ends when the session does.
	Context() context.Context
	// Pending are the session's requests to the agent on fast calls'
	// streams, awaiting the agent's answers.
	Pending() *rpcwire.Pending
	// Passed, BadID and Ambiguous are stdiofront.Transport's hooks of
	// the same names: a call the fast path leaves to go-sdk, a message
	// with a bad id, a request whose meaning is ambiguous.
	Passed(req *jsonrpc.Request)
	BadID(body []byte, why string)
	Ambiguous(req *jsonrpc.Request, body []byte) (id jsonrpc.ID, e *jsonrpc.Error, refused bool)
	// CancelCall takes notifications/cancelled's params: it reports
	// whether they named a fast call in flight (which is cancelled).
	CancelCall(params json.RawMessage) bool
	// Call answers the tools/call req on st; it reports false, with
	// nothing written, when go-sdk must answer it.
	Call(req *jsonrpc.Request, st *Stream) bool
}

type sessCtxKey struct{}

// front is the agent-facing MCP endpoint of one configuration.
type front struct {
	core                     Core
	o                        Options
	maxBytes                 int64
	bodyTimeout, stall       time.Duration
	maxSessions, maxPerAgent int
	perAgentInherited        bool
	idleEnd                  string
	sdk                      http.Handler
	certWarn, sessionWarn    everySecond
}

// New returns the agent-facing MCP endpoint (mount it at /mcp): it
// authenticates every request, binds each session to the identity that
// opened it, and serves MCP over Streamable HTTP with idle-session reaping,
// DNS-rebinding protection and a request size limit.
func New(core Core, o Options) http.Handler {
	timeout := o.SessionTimeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	if timeout < 0 {
		timeout = 0
	}
	f := &front{core: core, o: o, maxBytes: o.MaxRequestBytes, bodyTimeout: o.BodyTimeout, stall: o.WriteStallTimeout}
	if f.maxBytes <= 0 {
		f.maxBytes = 4 << 20
	}
	if f.bodyTimeout <= 0 {
		f.bodyTimeout = time.Minute
	}
	if f.o.TokenSet == nil {
		f.o.TokenSet = NewTokenSet(o.Tokens)
	}
	if f.stall <= 0 {
		f.stall = core.CallTimeout()
	}
	f.maxSessions, f.maxPerAgent = sessionbounds.Resolve(o.MaxSessions, o.MaxSessionsPerAgent)
	core.SessionBound(f.maxSessions)
	// Unset, the bound per agent is the bound in all when that is below
	// the default (sessionbounds.Resolve): then raising
	// server.max_sessions raises it. At or above the default it is the
	// default, which only server.max_sessions_per_agent raises.
	f.perAgentInherited = sessionbounds.PerAgentInherited(o.MaxSessions, o.MaxSessionsPerAgent)
	f.idleEnd = fmt.Sprintf("idle ones end after %s, server.session_timeout", timeout)
	if timeout == 0 {
		f.idleEnd = "idle ones do not end: server.session_timeout is off"
	}
	probe := mcp.NewServer(core.Implementation(), nil)
	f.sdk = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		if s, ok := r.Context().Value(sessCtxKey{}).(Session); ok {
			return s.Server()
		}
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			if s := core.Session(id); s != nil {
				return s.Server()
			}
		}
		return probe
	}, &mcp.StreamableHTTPOptions{
		// The gateway times idle sessions out itself (Core.ReapIdle):
		// go-sdk never sees the calls the fast path answers.
		MaxRequestBodyBytes: f.maxBytes,
		Logger:              core.Logger(),
	})
	if timeout > 0 {
		go core.ReapIdle(timeout)
	}
	return f
}

// ServeHTTP bounds, checks and authenticates one request, then serves it in
// its session (serveSession), opens one (serveNew) or leaves it to go-sdk.
func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
		r.Body = http.MaxBytesReader(w, r.Body, f.maxBytes)
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(f.bodyTimeout))
	}
	// DNS-rebinding protection, go-sdk's rule, checked here for every
	// request because the fast path never reaches go-sdk.
	if rebound(r) {
		refuseUnread(w, r, http.StatusForbidden, fmt.Sprintf("cmcp: forbidden: invalid Host header %q: a gateway listening on a loopback address answers only requests addressed to a loopback host (DNS-rebinding protection)", r.Host))
		return
	}
	who, tok, authID, rawToken, err := authenticateAgent(r, f.o)
	if err != nil {
		f.refuseAuth(w, r, err)
		return
	}
	if r.Method == http.MethodPost && refuseBatch(w, r) {
		return
	}
	if id := r.Header.Get("Mcp-Session-Id"); id != "" {
		f.serveSession(w, r, id, who, tok, authID, rawToken)
		return
	}
	if r.Method == http.MethodPost {
		f.serveNew(w, r, who, tok, authID, rawToken)
		return
	}
	f.sdk.ServeHTTP(w, r)
}

// refuseAuth answers a request whose agent is not authenticated (err
// says why): 401 with the challenge (OAuth's, with Options.OAuth).
func (f *front) refuseAuth(w http.ResponseWriter, r *http.Request, err error) {
	var ce *certRefusedError
	if errors.As(err, &ce) {
		if ok, quiet := f.certWarn.allow(); ok {
			f.core.Logger().Warn("refused a verified client certificate (401)", append(ce.logAttrs(), "refused_since_last_warning", quiet)...)
		}
	}
	status := http.StatusUnauthorized
	if f.o.OAuth != nil {
		// RFC 6750 and RFC 9728: the challenge names the
		// resource metadata, and the error when a token was
		// judged (none for a request without one).
		var oe *oauthRefusal
		var judged error
		if errors.As(err, &oe) {
			judged = oe.err
		}
		status = f.o.OAuth.Challenge(w.Header(), judged)
	} else {
		w.Header().Set("WWW-Authenticate", `Bearer realm="cmcp"`)
	}
	refuseUnread(w, r, status, "cmcp: "+err.Error())
}

// serveSession serves a request that names its session (Mcp-Session-Id
// id): only the identity that opened the session may use it. A POST goes to
// the fast path first.
func (f *front) serveSession(w http.ResponseWriter, r *http.Request, id, who string, tok digest.Digest, authID *oauth.Identity, rawToken credential.Secret) {
	s := f.core.Session(id)
	if s != nil && s.Principal() != who {
		refuseUnread(w, r, http.StatusForbidden, "cmcp: this session belongs to another identity; open your own session")
		return
	}
	if s != nil {
		s.AuthedWith(authID, rawToken)
	}
	if s != nil && r.Method == http.MethodGet {
		s.StreamOpenedWith(tok)
	}
	if s != nil && r.Method == http.MethodDelete {
		// go-sdk's DELETE closes the session at once, which holds
		// until the requests go-sdk answers are done and then
		// drops their answers: the session's calls are cut and
		// answered first. Cut, it ends even if go-sdk refuses the
		// DELETE.
		end := s.Delete()
		defer func() { go end() }()
	}
	if s != nil && r.Method == http.MethodPost {
		defer s.PostBegan()()
		sw := newStallWriter(w, f.stall)
		defer sw.finish()
		w = sw
		if f.fast(s, w, r) {
			return
		}
	}
	f.sdk.ServeHTTP(w, r)
}

// serveNew serves a POST without a session: an initialize opens one, in a
// place under the session bounds.
func (f *front) serveNew(w http.ResponseWriter, r *http.Request, who string, tok digest.Digest, authID *oauth.Identity, rawToken credential.Secret) {
	if f.core.Draining() {
		refuseUnread(w, r, http.StatusServiceUnavailable, "cmcp: the gateway is shutting down")
		return
	}
	release, limit, open := f.core.TakeSlot(who, f.maxSessions, f.maxPerAgent)
	if release == nil {
		f.refuseSession(w, r, who, limit, open)
		return
	}
	if refuseWithoutSession(w, r) {
		release()
		return
	}
	s := f.core.OpenSession(who, tok, release)
	s.AuthedWith(authID, rawToken)
	r = r.WithContext(context.WithValue(r.Context(), sessCtxKey{}, s))
	// A request that opened no session (not an initialize, or
	// one that failed) gives its slot back; a session gives it
	// back when it ends.
	defer func() {
		if !s.Initialized() {
			release()
		}
	}()
	sw := newStallWriter(w, f.stall)
	defer sw.finish()
	f.sdk.ServeHTTP(sw, r)
}

// refuseSession answers a request that would open a session past a bound:
// 429 when it is the agent's own bound, 503 when it is the gateway's, with
// a JSON-RPC error saying what to do. It is logged (at most once a second,
// with a count) and counted in cmcp_sessions_refused_total. When the bound
// per agent is unset and so is server.max_sessions (SessionBounds), the
// operator must raise the latter to raise it.
func (f *front) refuseSession(w http.ResponseWriter, r *http.Request, who, limit string, open int) {
	status, code := http.StatusTooManyRequests, CodeTooManySessions
	why := fmt.Sprintf("agent %q already has as many open sessions as server.max_sessions_per_agent allows (%d): end the sessions you no longer use (HTTP DELETE with their Mcp-Session-Id; %s), or ask the gateway's operator to raise server.max_sessions_per_agent", who, open, f.idleEnd)
	if f.perAgentInherited {
		why = fmt.Sprintf("agent %q already has as many open sessions as server.max_sessions allows (%d; server.max_sessions_per_agent is unset, so one agent may hold them all): end the sessions you no longer use (HTTP DELETE with their Mcp-Session-Id; %s), or ask the gateway's operator to raise server.max_sessions", who, open, f.idleEnd)
	}
	if limit == LimitTotal {
		status = http.StatusServiceUnavailable
		why = fmt.Sprintf("the gateway already has as many open sessions as server.max_sessions allows (%d): retry later (%s), or ask the gateway's operator to raise server.max_sessions", open, f.idleEnd)
	}
	if ok, quiet := f.sessionWarn.allow(); ok {
		f.core.Logger().Warn("refused a new session: "+limit+" session bound reached", "agent", who, "open", open, "status", status, "refused_since_last_warning", quiet)
	}
	f.core.SessionRefused(limit)
	dropBody(w, r)
	b, _ := json.Marshal("cmcp: " + why)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":null,"error":{"code":%d,"message":%s}}`+"\n", code, b)
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
