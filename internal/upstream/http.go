package upstream

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/credential"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// HTTPOptions describes one Streamable HTTP upstream. Secrets are never in
// the options themselves: they name the environment variables or files that
// hold them, and are read when the transport is built. Nothing an agent sends
// ever reaches the upstream as a credential.
type HTTPOptions struct {
	// Name is the upstream's name, used in every error.
	Name string
	// URL is the MCP endpoint, https:// or http://.
	URL string
	// TLSPin is "sha256:<hex>" of the server's SubjectPublicKeyInfo. With a
	// pin the CA chain is not consulted: exactly this key is accepted.
	TLSPin string
	// CAFile is a PEM file of roots to verify an unpinned https:// server
	// against, instead of the system pool.
	CAFile string
	// AllowRemotePlaintext permits http:// to a non-loopback address.
	AllowRemotePlaintext bool
	// BearerTokenEnv / BearerTokenFile name where the upstream's bearer token
	// is (at most one of them). A file's trailing newline is dropped.
	BearerTokenEnv  string
	BearerTokenFile string
	// HeadersFromEnv / HeadersFromFile set extra request headers (header name
	// -> environment variable / file), e.g. an API key header.
	HeadersFromEnv  map[string]string
	HeadersFromFile map[string]string
	// ConnectTimeout bounds the TCP connect and TLS handshake (default 10s).
	ConnectTimeout time.Duration
	// LookupEnv reads the gateway's environment (default os.LookupEnv).
	LookupEnv func(string) (string, bool)
	// Credentials, if set, mints the Authorization of each connection for
	// the identity it serves (ConnectOptions.Identity), instead of a
	// static bearer token (which must then not be set).
	Credentials *credential.Broker
}

// HTTPUpstream is a configured, not yet connected, HTTP upstream: an MCP
// transport whose every connection is checked against the pin (or CA) and
// whose requests carry the configured credentials.
type HTTPUpstream struct {
	name  string
	class string
	pin   digest.Digest
	// url is the endpoint without its query: the query may hold a secret
	// (?api_key=...), so only the client's transport adds it to requests,
	// and no error, log line or audit record ever has it.
	url    string
	verify *pinVerifier
	client *http.Client
	// opts and cred: ReloadCredentials reads the credentials again as
	// opts says and puts them in cred, the client's transport.
	opts HTTPOptions
	cred *credentialTransport
}

// NewHTTP validates o, reads its credentials and builds the transport. It
// does no network I/O; the first connection is made by Connect.
func NewHTTP(o HTTPOptions) (*HTTPUpstream, error) {
	if o.Name == "" {
		return nil, errors.New("http upstream: name is empty")
	}
	errf := func(format string, args ...any) error {
		return fmt.Errorf("upstream %q: "+format, append([]any{o.Name}, args...)...)
	}
	u, err := parseHTTPURL(o.URL, errf)
	if err != nil {
		return nil, err
	}
	endpoint := *u
	endpoint.RawQuery, endpoint.ForceQuery, endpoint.Fragment, endpoint.RawFragment = "", false, "", ""
	up := &HTTPUpstream{name: o.Name, url: endpoint.String(), verify: &pinVerifier{upstream: o.Name}}
	timeout := o.ConnectTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:               nil, // never route an upstream through an ambient HTTP(S)_PROXY
		DialContext:         dialer.DialContext,
		TLSHandshakeTimeout: timeout,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	if err := up.secure(o, u, tr, dialer, errf); err != nil {
		return nil, err
	}

	hdr, err := readCredentials(o, errf)
	if err != nil {
		return nil, err
	}
	if o.Credentials != nil && hdr.Get("Authorization") != "" {
		return nil, errf("a credential source and a static Authorization (bearer_token_env / bearer_token_file / a header) are both set; keep one")
	}
	up.opts = o
	up.cred = &credentialTransport{upstream: o.Name, base: tr, endpoint: &endpoint, query: u.RawQuery}
	up.cred.header.Store(&hdr)
	up.client = &http.Client{
		Transport: up.cred,
		// The transport refuses redirects with a clear error (which this
		// hook's would not be: the client quotes the Location, query and
		// all); one without a Location is not followed either.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if o.Credentials != nil {
		o.Credentials.UseUpstreamClient(up.client)
	}
	return up, nil
}

// parseHTTPURL parses an upstream's URL, which must name a host and carry
// no user info. No error quotes its query, which may hold a secret.
func parseHTTPURL(raw string, errf func(string, ...any) error) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// *url.Error repeats the url, query and all.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, errf("url: %w", err)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, errf("url %q has no host; write it as https://host:port/mcp", config.RedactedURL(u))
	}
	if u.User != nil {
		return nil, errf("url %q carries user info; put credentials in bearer_token_env / bearer_token_file instead", config.RedactedURL(u))
	}
	return u, nil
}

// secure sets h.class and how tr checks the upstream by u's scheme: an
// https:// server's key against the pin, or its chain against the CA file
// or the system roots; an http:// one only on a loopback address (dialer
// checks the address dialled), unless o allows remote plaintext.
func (h *HTTPUpstream) secure(o HTTPOptions, u *url.URL, tr *http.Transport, dialer *net.Dialer, errf func(string, ...any) error) error {
	switch u.Scheme {
	case "https":
		if o.TLSPin != "" {
			pin, err := ParsePin(o.TLSPin)
			if err != nil {
				return errf("%w", err)
			}
			if o.CAFile != "" {
				return errf("both tls_pin and ca_file are set; a pin already names the one key to accept, remove ca_file")
			}
			h.pin, h.verify.want, h.class = pin, pin, ClassTLSPinned
			tr.TLSClientConfig = pinnedTLSConfig(h.verify, u.Hostname())
		} else {
			var roots *x509.CertPool
			if o.CAFile != "" {
				pem, err := os.ReadFile(o.CAFile)
				if err != nil {
					return errf("ca_file: %w", err)
				}
				roots = x509.NewCertPool()
				if !roots.AppendCertsFromPEM(pem) {
					return errf("ca_file %s holds no PEM certificate", o.CAFile)
				}
			}
			h.class = ClassTLSCA
			tr.TLSClientConfig = caTLSConfig(h.verify, u.Hostname(), roots)
		}
	case "http":
		if o.TLSPin != "" || o.CAFile != "" {
			return errf("tls_pin / ca_file set on an http:// url %q; use https:// or remove them", config.RedactedURL(u))
		}
		h.class = ClassPlaintext
		if !o.AllowRemotePlaintext {
			if !config.IsLoopbackHost(u.Hostname()) {
				return errf("plaintext http:// to %s, which is not a loopback address; use https:// with tls_pin, "+
					"or set allow_remote_plaintext: true to accept an unauthenticated, unencrypted link", u.Host)
			}
			// Also check the address actually dialled, so that a name which
			// resolves elsewhere (or changes its mind) is refused.
			dialer.Control = func(network, address string, _ syscall.RawConn) error {
				host, _, err := net.SplitHostPort(address)
				if err != nil {
					return err
				}
				if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
					return errf("plaintext connection to %s refused: not a loopback address", address)
				}
				return nil
			}
		}
	default:
		return errf("url scheme %q is not supported; use https:// (or http:// on loopback)", u.Scheme)
	}
	return nil
}

// Name is the upstream's configured name.
func (h *HTTPUpstream) Name() string { return h.name }

// ReloadCredentials reads the credential files (bearer_token_file,
// headers_from_file) again and puts what they hold in force for every
// request from then on, on open connections too. It reports whether a
// credential changed; a file that cannot be read, or holds no valid
// credential, changes nothing and is the error. Credentials from the
// environment stay as they were read at start: the environment of a
// running gateway does not change.
func (h *HTTPUpstream) ReloadCredentials() (changed bool, err error) {
	if h.opts.BearerTokenFile == "" && len(h.opts.HeadersFromFile) == 0 {
		return false, nil
	}
	hdr, err := readCredentials(h.opts, func(format string, args ...any) error {
		return fmt.Errorf("upstream %q: "+format, append([]any{h.name}, args...)...)
	})
	if err != nil {
		return false, err
	}
	if reflect.DeepEqual(*h.cred.header.Load(), hdr) {
		return false, nil
	}
	h.cred.header.Store(&hdr)
	return true, nil
}

// CredentialsFromEnvironment reports whether any of the upstream's
// credentials come from environment variables, which only a restart reads
// again.
func (h *HTTPUpstream) CredentialsFromEnvironment() bool {
	return h.opts.BearerTokenEnv != "" || len(h.opts.HeadersFromEnv) > 0
}

// Class is the evidence class: tls-pinned, tls-ca or plaintext.
func (h *HTTPUpstream) Class() string { return h.class }

// Pin is the configured SPKI pin (zero unless the class is tls-pinned).
func (h *HTTPUpstream) Pin() digest.Digest { return h.pin }

// ObservedKey is the SPKI digest of the key the server presented in the last
// TLS handshake that was accepted (zero before the first https connection,
// or for plaintext). A key the pin refused is never observed.
func (h *HTTPUpstream) ObservedKey() digest.Digest { return h.verify.lastSeen() }

// URL is the endpoint, without user info and without its query (the
// client's transport adds that to the requests it sends to the endpoint).
func (h *HTTPUpstream) URL() string { return h.url }

// HTTPClient is the pinned, credentialed client (for tests and probes).
func (h *HTTPUpstream) HTTPClient() *http.Client { return h.client }

// Credentials is the broker that mints the upstream's per-identity
// credentials, or nil.
func (h *HTTPUpstream) Credentials() *credential.Broker { return h.opts.Credentials }

// clientFor is the client of one connection: the upstream's pinned,
// credentialed client, and, with a credential source, the credential
// minted for id on every request.
func (h *HTTPUpstream) clientFor(id *credential.Identity) (*http.Client, error) {
	b := h.opts.Credentials
	if b == nil {
		return h.client, nil
	}
	if id == nil || id.Name == "" {
		return nil, fmt.Errorf("upstream %q: its %s credential is minted per identity, and this connection serves none "+
			"(an unauthenticated agent, or the gateway's own probe)", h.name, b.Source())
	}
	return &http.Client{Transport: &credential.Transport{Broker: b, Identity: *id, Base: h.client.Transport}, CheckRedirect: h.client.CheckRedirect}, nil
}

// transport returns a go-sdk transport for one new MCP session with the
// upstream over client, and where the key of the connection that carries
// its first answer (to initialize) is kept. Sessions share the connection
// pool and the pin.
func (h *HTTPUpstream) transport(client *http.Client) (mcp.Transport, *firstKey) {
	key := &firstKey{base: client.Transport}
	return &mcp.StreamableClientTransport{
		Endpoint:   h.url,
		HTTPClient: &http.Client{Transport: key, CheckRedirect: client.CheckRedirect},
		MaxRetries: 2,
	}, key
}

// firstKey keeps the server key of the first answer a session got over
// TLS: a key the handshake accepted (the pin's, or one whose chain was
// verified), of a connection this session used. Keys seen by other
// sessions' handshakes meanwhile do not count.
type firstKey struct {
	base http.RoundTripper
	key  atomic.Pointer[digest.Digest]
}

func (k *firstKey) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := k.base.RoundTrip(req)
	if err == nil && resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 && k.key.Load() == nil {
		d := SPKIDigest(resp.TLS.PeerCertificates[0])
		k.key.CompareAndSwap(nil, &d)
	}
	return resp, err
}

// Connect implements Upstream: it opens a new MCP session over Streamable
// HTTP, at the gateway's pinned protocol version. A refused key comes back
// as *PinMismatchError (errors.As), whatever the SDK wrapped it in; the
// connection was closed before any request was sent.
func (h *HTTPUpstream) Connect(ctx context.Context, client *mcp.Client, opts ConnectOptions) (*Conn, error) {
	// The client session gets go-sdk's own transport, unwrapped: go-sdk
	// opens the standalone SSE stream (where a server sends list_changed
	// and resource updates) only on its own connection type, so an
	// Intercept wrapper would silently cut the session off from them.
	// Intercept sees the messages on the streams of raw calls instead
	// (httpRaw); the client session's handlers take the rest.
	hc, err := h.clientFor(opts.Identity)
	if err != nil {
		return nil, err
	}
	tr, key := h.transport(hc)
	client.AddReceivingMiddleware(limitServerRequests())
	cs, err := client.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	if err != nil {
		return nil, h.explain("connect "+h.url, err)
	}
	ref := h.url
	if k := key.key.Load(); k != nil {
		ref += " key " + k.String()
	}
	conn := NewConn(cs, h.class, ref, nil, nil)
	version := ProtocolVersion
	if init := cs.InitializeResult(); init != nil && init.ProtocolVersion != "" {
		version = init.ProtocolVersion
	}
	raw := &httpRaw{up: h, client: hc, session: cs.ID(), version: version, intercept: opts.Intercept, serverRequest: opts.ServerRequest}
	conn.raw = raw.call
	return conn, nil
}

// explain turns an error of op (an SDK or HTTP client error) into one that
// names the upstream and, for a key this request's handshake refused, is
// the typed pin error. Only err itself says so: another request's refused
// handshake (other connections share the pool) says nothing about this one.
func (h *HTTPUpstream) explain(op string, err error) error {
	var pm *PinMismatchError
	if errors.As(err, &pm) {
		return pm
	}
	var ua x509.UnknownAuthorityError
	if errors.As(err, &ua) {
		return fmt.Errorf("upstream %q: %s: %w (the server's certificate is not signed by a trusted CA; "+
			"set ca_file, or pin its key with tls_pin)", h.name, op, err)
	}
	return fmt.Errorf("upstream %q: %s: %w", h.name, op, err)
}

// credentialTransport adds the configured headers to every request, and the
// configured url's query to every request for the endpoint. Both are
// secrets: they are never logged and never taken from an agent. The query
// is added here, below http.Client and go-sdk, so that neither has it to
// put in an error (*url.Error repeats the request's url); an error from
// below that does have it is scrubbed.
type credentialTransport struct {
	upstream string // its name, for the errors it makes
	base     http.RoundTripper
	header   atomic.Pointer[http.Header] // replaced whole by ReloadCredentials
	endpoint *url.URL                    // the configured url without its query
	query    string                      // its raw query, or ""
}

func (t *credentialTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.roundTrip(req)
	if err == nil && resp.StatusCode >= 300 && resp.StatusCode < 400 && resp.Header.Get("Location") != "" {
		// Refused here, not in the client's CheckRedirect: the client
		// would quote the Location, query and all, in its error.
		loc, lerr := req.URL.Parse(resp.Header.Get("Location"))
		where := "another url"
		if lerr == nil {
			where = config.RedactedURL(loc)
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		return nil, fmt.Errorf("the server redirected (%s) to %s; upstreams are not followed across redirects "+
			"(the pin and credentials belong to the configured url), configure the final url instead", resp.Status, where)
	}
	if err == nil {
		// go-sdk reads a JSON answer (initialize, the lists, resources/read,
		// prompts/get, completion) and a refusal's body whole into memory:
		// bounded here, for raw calls too. An event stream is bounded per
		// event instead (go-sdk's MaxEventSize, sseReader), never in all.
		switch {
		case resp.StatusCode < 200 || resp.StatusCode > 299:
			resp.Body = &limitedBody{body: resp.Body, left: maxRefusalBody, limit: maxRefusalBody, upstream: t.upstream}
		case baseMediaType(resp.Header.Get("Content-Type")) != "text/event-stream":
			resp.Body = &limitedBody{body: resp.Body, left: maxFrame, limit: maxFrame, upstream: t.upstream}
		}
	}
	return resp, err
}

// maxRefusalBody bounds the body of a non-2xx answer, which is read only
// for the JSON-RPC error it may hold.
const maxRefusalBody = 1 << 20

// AnswerTooLargeError says that an HTTP upstream's answer that is not an
// event stream (a JSON-RPC response, or the body of a refusal) was longer
// than it may be. The gateway stopped reading it and closed the connection
// it came on.
type AnswerTooLargeError struct {
	Upstream string
	Limit    int64 // bytes
}

func (e *AnswerTooLargeError) Error() string {
	return fmt.Sprintf("upstream %q: its answer exceeded the limit of %d MiB and was not read further; "+
		"each JSON-RPC message an HTTP upstream sends, results included, must fit in %d MiB", e.Upstream, e.Limit>>20, maxFrame>>20)
}

// limitedBody reads at most left bytes of an answer, then fails with
// *AnswerTooLargeError if there is more.
type limitedBody struct {
	body        io.ReadCloser
	left, limit int64
	upstream    string
	err         error
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1] // one byte past the limit tells whether there is more
	}
	n, err := b.body.Read(p)
	if int64(n) <= b.left {
		b.left -= int64(n)
		return n, err
	}
	n = int(b.left)
	b.left = 0
	b.err = &AnswerTooLargeError{Upstream: b.upstream, Limit: b.limit}
	b.body.Close() // the rest is never read: the connection is not reused
	return n, b.err
}

func (b *limitedBody) Close() error { return b.body.Close() }

func (t *credentialTransport) roundTrip(req *http.Request) (*http.Response, error) {
	addQuery := t.query != "" && req.URL.RawQuery == "" && req.URL.Scheme == t.endpoint.Scheme &&
		req.URL.Host == t.endpoint.Host && req.URL.Path == t.endpoint.Path
	header := *t.header.Load()
	if len(header) == 0 && !addQuery {
		return t.base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	for k, vs := range header {
		r.Header[k] = vs
	}
	if addQuery {
		r.URL.RawQuery = t.query
	}
	resp, err := t.base.RoundTrip(r)
	if resp != nil {
		resp.Request = req // not the clone, which has the query
	}
	if err != nil && t.query != "" && strings.Contains(err.Error(), t.query) {
		err = &scrubbedError{msg: strings.ReplaceAll(err.Error(), t.query, "[query removed]"), err: err}
	}
	return resp, err
}

// scrubbedError is an error whose message had the endpoint's query in it;
// msg is the message without it. errors.Is and errors.As see the original.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

func readCredentials(o HTTPOptions, errf func(string, ...any) error) (http.Header, error) {
	lookup := o.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	fromEnv := func(what, name string) (string, error) {
		v, ok := lookup(name)
		if !ok || v == "" {
			return "", errf("%s: environment variable %s is not set (or empty) in the gateway's environment", what, name)
		}
		return v, nil
	}
	fromFile := func(what, path string) (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", errf("%s: %w", what, err)
		}
		v, err := config.Credential(b)
		if err != nil {
			return "", errf("%s: %s %w", what, path, err)
		}
		return v, nil
	}
	h := http.Header{}
	set := func(name, value string) error {
		if strings.ContainsAny(value, "\r\n") {
			return errf("credential for header %s contains a line break", name)
		}
		if h.Get(name) != "" {
			return errf("header %s is configured twice", name)
		}
		h.Set(name, value)
		return nil
	}
	if o.BearerTokenEnv != "" && o.BearerTokenFile != "" {
		return nil, errf("both bearer_token_env and bearer_token_file are set; keep one")
	}
	for _, m := range []map[string]string{o.HeadersFromEnv, o.HeadersFromFile} {
		for name := range m {
			if !config.ValidHeaderName(name) {
				return nil, errf("%q is not a valid HTTP header name", name)
			}
			if config.ProtocolHeader(name) {
				return nil, errf("header %s is part of the HTTP or MCP protocol and cannot be configured", name)
			}
		}
	}
	if o.BearerTokenEnv != "" {
		v, err := fromEnv("bearer_token_env", o.BearerTokenEnv)
		if err != nil {
			return nil, err
		}
		if err := set("Authorization", "Bearer "+v); err != nil {
			return nil, err
		}
	}
	if o.BearerTokenFile != "" {
		v, err := fromFile("bearer_token_file", o.BearerTokenFile)
		if err != nil {
			return nil, err
		}
		if err := set("Authorization", "Bearer "+v); err != nil {
			return nil, err
		}
	}
	for name, env := range o.HeadersFromEnv {
		v, err := fromEnv("header "+name, env)
		if err != nil {
			return nil, err
		}
		if err := set(name, v); err != nil {
			return nil, err
		}
	}
	for name, path := range o.HeadersFromFile {
		v, err := fromFile("header "+name, path)
		if err != nil {
			return nil, err
		}
		if err := set(name, v); err != nil {
			return nil, err
		}
	}
	return h, nil
}

var _ Upstream = (*HTTPUpstream)(nil)

// HTTPOptionsFromConfig maps an upstream's `http:` section (validated by
// config.Load) to HTTPOptions. lookupEnv reads the gateway's environment
// for the credential variables (nil: os.LookupEnv).
func HTTPOptionsFromConfig(name string, c *config.HTTP, lookupEnv func(string) (string, bool)) HTTPOptions {
	o := HTTPOptions{
		Name:                 name,
		URL:                  c.URL,
		CAFile:               c.CAFile,
		AllowRemotePlaintext: c.AllowRemotePlaintext,
		BearerTokenEnv:       c.BearerTokenEnv,
		BearerTokenFile:      c.BearerTokenFile,
		HeadersFromEnv:       c.HeadersFromEnv,
		HeadersFromFile:      c.HeadersFromFile,
		ConnectTimeout:       c.ConnectTimeout,
		LookupEnv:            lookupEnv,
	}
	if !c.TLSPin.IsZero() {
		o.TLSPin = c.TLSPin.String()
	}
	return o
}
