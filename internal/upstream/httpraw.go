package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
)

// httpRaw makes raw calls on one MCP session with a Streamable HTTP
// upstream: each is a POST of its own to the endpoint, through the same
// pinned, credentialed client as the session, with the session's id and
// protocol version. The session itself (initialize, lists, the standalone
// GET stream, notifications) stays with go-sdk.
type httpRaw struct {
	up            *HTTPUpstream
	client        *http.Client // the connection's: the upstream's, or with the identity's credential
	session       string       // Mcp-Session-Id ("" for a sessionless server)
	version       string       // the negotiated protocol version
	intercept     func(jsonrpc.Message) bool
	serverRequest func(context.Context, *jsonrpc.Request) (json.RawMessage, error)
	next          atomic.Uint64
}

// cancelTimeout bounds the POST of notifications/cancelled for a raw call
// given up on.
const cancelTimeout = 2 * time.Second

// drainTimeout bounds how long the rest of a response stream is read (in
// the background) after the response, so that the connection can be
// reused; a server that keeps the stream open longer costs its connection.
const drainTimeout = 50 * time.Millisecond

func (c *httpRaw) call(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := rawIDPrefix + strconv.FormatUint(c.next.Add(1), 10)
	// The POST's context follows the caller's only until the response is
	// in: what the server sends after it is read in the background, so the
	// connection goes back to the pool without delaying the call.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	res, drain, err := c.roundTrip(rctx, id, method, encodeRequest(id, method, params))
	stop()
	if drain != nil {
		go func() {
			t := time.AfterFunc(drainTimeout, cancel)
			drain()
			t.Stop()
			cancel()
		}()
	} else {
		cancel()
	}
	if err != nil && ctx.Err() != nil {
		c.cancelled(ctx, id)
		return nil, ctx.Err()
	}
	return res, err
}

// roundTrip posts the request and reads the response to it. On success
// over an event stream, drain reads the rest of the stream and closes it.
func (c *httpRaw) roundTrip(rctx context.Context, id, method string, body []byte) (res json.RawMessage, drain func(), err error) {
	resp, err := c.post(rctx, body)
	if err != nil {
		return nil, nil, c.up.explain(method, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, nil, c.statusError(method, id, resp)
	}
	switch ct := baseMediaType(resp.Header.Get("Content-Type")); ct {
	case "application/json":
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxFrame+1))
		var tl *AnswerTooLargeError
		if errors.As(err, &tl) {
			return nil, nil, tl // it names the upstream
		}
		if err != nil {
			return nil, nil, c.up.explain(method, fmt.Errorf("read the response: %w", err))
		}
		if len(b) > maxFrame {
			return nil, nil, c.errorf(method, "the response is larger than %d bytes", maxFrame)
		}
		msg, err := rpcwire.DecodeMessage(b)
		if err != nil {
			return nil, nil, c.errorf(method, "the response is not a JSON-RPC message: %v", err)
		}
		r, ok := msg.(*jsonrpc.Response)
		if !ok || !isID(r.ID, id) {
			return nil, nil, c.errorf(method, "the upstream answered with a JSON body that is not the response to the request")
		}
		if r.Error != nil {
			return nil, nil, r.Error
		}
		return r.Result, nil, nil
	case "text/event-stream":
		cs := &callStream{body: resp.Body, sr: newSSEReader(resp.Body, maxFrame)}
		res, err := c.stream(rctx, cs, id, method)
		if err != nil {
			cs.body.Close()
			return nil, nil, err
		}
		// A server closes the stream after the response; reading on to
		// its end lets the connection be reused.
		return res, func() {
			_, _ = io.CopyN(io.Discard, cs.sr.r, 64<<10)
			cs.body.Close()
		}, nil
	default:
		resp.Body.Close()
		return nil, nil, c.errorf(method, "the upstream answered HTTP %d with content type %q, which is neither application/json nor text/event-stream", resp.StatusCode, ct)
	}
}

// callStream is the event stream a call's response comes on: the POST's
// response body, or a GET that resumed it.
type callStream struct {
	body io.ReadCloser
	sr   *sseReader
}

// resumeAttempts bounds how many times in a row a call's event stream is
// resumed without an event coming through (go-sdk's client allows as
// many). resumeTries bounds the GETs of one resumption (the server may
// still hold the broken stream for a moment: 409), resumeDelay is the wait
// before the first, doubled for each further one (0.05 + 0.1 + ... 1.55 s).
const (
	resumeAttempts = 2
	resumeTries    = 5
	resumeDelay    = 50 * time.Millisecond
)

// stream reads the events of a call's response stream in order until the
// response: notifications go to the intercept function (and are otherwise
// dropped), requests are answered through serverRequest. A stream that
// breaks or ends before the response is resumed where it stopped (a GET
// with Last-Event-ID, as Streamable HTTP provides) if the server numbers
// its events; otherwise the call fails.
func (c *httpRaw) stream(ctx context.Context, cs *callStream, id, method string) (json.RawMessage, error) {
	stalls, progress := 0, ""
	asked := make(chan struct{}, maxServerRequests) // the upstream's requests this call answers now
	for {
		ev, err := cs.sr.next()
		if err != nil {
			if errors.Is(err, errEventTooLarge) {
				return nil, c.errorf(method, "response stream: %v", err)
			}
			broken := c.up.explain(method, fmt.Errorf("read the response stream: %w", err))
			if errors.Is(err, io.EOF) {
				broken = c.errorf(method, "the response stream ended before the response")
			}
			last := cs.sr.lastID
			if last == "" || ctx.Err() != nil {
				return nil, broken
			}
			if last == progress {
				stalls++
			} else {
				stalls, progress = 0, last
			}
			if stalls >= resumeAttempts {
				return nil, fmt.Errorf("%w; resumed %d times from event %q without getting further", broken, stalls, last)
			}
			if rerr := c.resume(ctx, cs); rerr != nil {
				return nil, fmt.Errorf("%w; resuming it from event %q failed: %v", broken, last, rerr)
			}
			continue
		}
		if len(ev.data) == 0 || (ev.name != "" && ev.name != "message") {
			continue
		}
		msg, err := rpcwire.DecodeMessage(ev.data)
		if err != nil {
			return nil, c.errorf(method, "an event on the response stream is not a JSON-RPC message: %v", err)
		}
		switch m := msg.(type) {
		case *jsonrpc.Response:
			if !isID(m.ID, id) {
				continue // not ours: nothing waits for it on this stream
			}
			if m.Error != nil {
				return nil, m.Error
			}
			return m.Result, nil
		case *jsonrpc.Request:
			if m.IsCall() {
				select {
				case asked <- struct{}{}:
					go func() {
						defer func() { <-asked }()
						c.answer(ctx, m)
					}()
				default:
					// Refused here, before the next event is read: a flood
					// is answered at the pace the upstream takes the
					// refusals, and costs no goroutine.
					c.refuse(ctx, m)
				}
			} else if c.intercept != nil {
				c.intercept(m)
			}
		}
	}
}

// resume replaces cs's broken stream by a GET that asks the server for the
// events after the last event id, trying up to resumeTries times, after
// the reconnection time the server asked for (its retry field), if longer.
func (c *httpRaw) resume(ctx context.Context, cs *callStream) error {
	cs.body.Close()
	last, retry := cs.sr.lastID, cs.sr.retry
	var err error
	for try := range resumeTries {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(max(resumeDelay<<try, retry)):
		}
		var resp *http.Response
		if resp, err = c.getEvents(ctx, last); err == nil {
			cs.body, cs.sr = resp.Body, newSSEReader(resp.Body, maxFrame)
			cs.sr.lastID, cs.sr.retry = last, retry
			return nil
		}
	}
	return err
}

// httpClient is the connection's client (the upstream's if none is set).
func (c *httpRaw) httpClient() *http.Client {
	if c.client != nil {
		return c.client
	}
	return c.up.client
}

// sessionHeaders sets the headers of a request in the connection's session.
func (c *httpRaw) sessionHeaders(h http.Header) {
	if c.session != "" {
		h["Mcp-Session-Id"] = []string{c.session}
	}
	if c.version != "" {
		h["Mcp-Protocol-Version"] = []string{c.version}
	}
}

// getEvents opens the event stream that continues after event lastID.
func (c *httpRaw) getEvents(ctx context.Context, lastID string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.up.url, nil)
	if err != nil {
		return nil, err
	}
	h := req.Header
	h.Set("Accept", "text/event-stream")
	h.Set("Last-Event-ID", lastID)
	c.sessionHeaders(h)
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, c.up.explain("resume", err)
	}
	if ct := baseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		resp.Body.Close()
		return nil, fmt.Errorf("the upstream answered HTTP %d with content type %q", resp.StatusCode, ct)
	}
	return resp, nil
}

// answer answers a request the upstream sent on a call's response stream,
// posting the response back (the upstream accepts it with 202).
func (c *httpRaw) answer(ctx context.Context, req *jsonrpc.Request) {
	var res json.RawMessage
	var err error
	if c.serverRequest == nil {
		err = &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("cmcp does not answer %s here", req.Method)}
	} else {
		res, err = c.serverRequest(ctx, req)
	}
	if ctx.Err() != nil {
		return // the call is over: nobody waits for the answer
	}
	b, eerr := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: req.ID, Result: res, Error: err})
	if eerr != nil {
		b, _ = jsonrpc.EncodeMessage(&jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: eerr.Error()}})
	}
	c.send(ctx, b)
}

// refuse answers a request the upstream sent on a call's response stream
// while maxServerRequests of its requests wait for their answers.
func (c *httpRaw) refuse(ctx context.Context, req *jsonrpc.Request) {
	b, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: req.ID, Error: tooManyServerRequests(req.Method)})
	if err != nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, cancelTimeout)
	defer cancel()
	c.send(sctx, b)
}

// cancelled tells the upstream, best effort, that the call id was given up.
func (c *httpRaw) cancelled(ctx context.Context, id string) {
	n := cancelledNotification(id, ctx.Err())
	go func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer cancel()
		c.send(sctx, n)
	}()
}

// send posts a notification or response, for which a server answers 202
// without a body.
func (c *httpRaw) send(ctx context.Context, msg []byte) {
	resp, err := c.post(ctx, msg)
	if err != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
}

func (c *httpRaw) post(ctx context.Context, body []byte) (*http.Response, error) {
	Waiting(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.up.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	h := req.Header
	h["Content-Type"] = []string{"application/json"}
	h["Accept"] = []string{"application/json, text/event-stream"}
	c.sessionHeaders(h)
	return c.httpClient().Do(req)
}

// statusError is the error for a call the upstream refused with a non-2xx
// status: its JSON-RPC error if the body is one, else the status (404: the
// upstream's session is gone).
func (c *httpRaw) statusError(method, id string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxFrame))
	var r *jsonrpc.Response
	if msg, err := rpcwire.DecodeMessage(b); err == nil {
		r, _ = msg.(*jsonrpc.Response)
	}
	if resp.StatusCode == http.StatusNotFound && c.session != "" {
		// Whatever the body says (some servers send a JSON-RPC error with
		// an id of their own): the session is gone, and the connection
		// must be made again.
		why := ""
		var je *jsonrpc.Error
		if r != nil && errors.As(r.Error, &je) {
			why = fmt.Sprintf(" (%q)", je.Message)
		}
		return fmt.Errorf("upstream %q: %s: the upstream no longer knows MCP session %s (HTTP 404%s): %w", c.up.name, method, c.session, why, mcp.ErrSessionMissing)
	}
	// The body's JSON-RPC error, if it answers this request.
	if r != nil && r.Error != nil && (isID(r.ID, id) || !r.ID.IsValid()) {
		return r.Error
	}
	return c.errorf(method, "the upstream answered HTTP %s", resp.Status)
}

func (c *httpRaw) errorf(method, format string, args ...any) error {
	return fmt.Errorf("upstream %q: %s: %s", c.up.name, method, fmt.Sprintf(format, args...))
}

// isID reports whether id is the string want.
func isID(id jsonrpc.ID, want string) bool {
	s, ok := id.Raw().(string)
	return ok && s == want
}

// baseMediaType is a Content-Type without its parameters, lowercased.
func baseMediaType(ct string) string {
	ct, _, _ = strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(ct))
}
