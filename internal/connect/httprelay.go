package connect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/tunnel/wire"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/framing"
)

// maxHTTPInFlight bounds the requests of one gateway session waiting for
// the local HTTP server's answer at once; more wait to be sent (and the
// session's queue, bounded too, fills behind them).
const maxHTTPInFlight = 64

// maxIdleServe bounds the serve goroutines of one session kept waiting to
// read again once their request is answered; more end.
const maxIdleServe = 8

// httpRelay is one gateway session's connection to a local Streamable HTTP
// MCP server (--http). It passes each message through as it is: a message
// from the gateway is POSTed verbatim, and each message the server answers
// with (a JSON body, or each message event of an event-stream body) goes
// to the gateway verbatim. Each message is checked to be one JSON-RPC
// message, never decoded into the SDK's types and encoded again: the relay
// adds the least it can to a call. Requests are in flight concurrently,
// up to maxHTTPInFlight (serve); the initialize request is answered before
// anything else is sent (its answer gives the server's session id and protocol
// version, sent with every later POST).
type httpRelay struct {
	s      *session
	url    string
	client *http.Client

	sid, proto atomic.Pointer[string]
	slots      chan struct{}
	// lead hands the reading of the session's messages to an idle serve
	// goroutine (idle counts them).
	lead chan struct{}
	idle atomic.Int32
	wg   sync.WaitGroup
}

func newHTTPRelay(s *session, url string, client *http.Client) *httpRelay {
	return &httpRelay{s: s, url: url, client: client, slots: make(chan struct{}, maxHTTPInFlight), lead: make(chan struct{})}
}

// serve reads the session's messages from the gateway and passes them to
// the server until the session ends. Answers, notifications and the
// handshake are sent in order, each answered (202) before the next is
// read. A request is posted by the goroutine that read it, once another
// serve goroutine took over the reading: the request goes out without a
// hand-over to another goroutine, and the session's later messages are
// still read while it waits for its answer. The reading goes to a serve
// goroutine that waits idle (its request answered) or, if none does, to a
// new one: a session that makes one call after another alternates between
// two goroutines, whose stacks have grown to what a POST takes, and
// starts none.
func (r *httpRelay) serve(ctx context.Context) {
	for {
		b, ok := r.read(ctx)
		if !ok {
			return
		}
		select {
		case r.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		select {
		case r.lead <- struct{}{}:
		default:
			r.wg.Add(1)
			go func() { defer r.wg.Done(); r.serve(ctx) }()
		}
		err := r.post(ctx, b, true, false)
		<-r.slots
		if err != nil {
			r.fail(ctx, err)
			return
		}
		if r.idle.Add(1) > maxIdleServe {
			r.idle.Add(-1)
			return
		}
		select {
		case <-r.lead:
			r.idle.Add(-1)
		case <-ctx.Done():
			return
		}
	}
}

// read posts the session's messages in order until it reads a request
// (one with an id, not initialize), which it returns for the caller to
// post; ok is false once the session ended.
func (r *httpRelay) read(ctx context.Context) (b []byte, ok bool) {
	for {
		var q queued
		select {
		case <-ctx.Done():
			return nil, false
		case q = <-r.s.in:
		}
		msg, err := q.decode()
		if err != nil {
			r.fail(ctx, fmt.Errorf("the gateway sent a message that is not JSON-RPC: %v", err))
			return nil, false
		}
		req, ok := msg.(*jsonrpc.Request)
		if !ok || !req.ID.IsValid() || req.Method == "initialize" {
			if err := r.post(ctx, q.m, ok && req.ID.IsValid(), ok && req.Method == "initialize"); err != nil {
				r.fail(ctx, err)
				return nil, false
			}
			continue
		}
		return q.m, true
	}
}

// fail ends the session with err, unless it ended already.
func (r *httpRelay) fail(ctx context.Context, err error) {
	if ctx.Err() == nil {
		r.s.end(err.Error())
	}
}

// isAnswer reports whether the JSON-RPC message b (valid JSON) is a
// response: an object without a top-level "method".
func isAnswer(b []byte) bool {
	method := false
	if !rpcwire.EachMember(b, func(name, _ []byte) {
		if string(name) == "method" {
			method = true
		}
	}) {
		msg, err := rpcwire.DecodeMessage(b)
		_, resp := msg.(*jsonrpc.Response)
		return err == nil && resp
	}
	return !method
}

// post sends b (a request when request is set) and passes on what the
// server answers.
func (r *httpRelay) post(ctx context.Context, b []byte, request, initialize bool) error {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("post to the server %s: %w", r.url, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "application/json, text/event-stream")
	r.headers(hr.Header)
	resp, err := r.client.Do(hr)
	if err != nil {
		return fmt.Errorf("post to the server %s: %w", r.url, err)
	}
	defer resp.Body.Close()
	if initialize {
		if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
			r.sid.Store(&sid)
		}
	}
	if resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusNoContent {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("the server %s answered HTTP %d: %s", r.url, resp.StatusCode, framing.Excerpt(excerpt))
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch ct {
	case "application/json":
		body, err := io.ReadAll(io.LimitReader(resp.Body, wire.MaxMessage+1))
		if err != nil {
			return fmt.Errorf("read the server's answer: %w", err)
		}
		if len(bytes.TrimSpace(body)) == 0 && !request {
			return nil // an empty 200 to a notification or an answer
		}
		return r.forward(ctx, body, initialize)
	case "text/event-stream":
		events := upstream.NewSSEMessages(resp.Body, wire.MaxMessage)
		defer events.Release()
		answered := false
		for {
			data, err := events.Next()
			if errors.Is(err, io.EOF) {
				if request && !answered {
					// The gateway's request would wait for its call
					// timeout: end the session now, saying why.
					return fmt.Errorf("the server %s ended its event stream before it answered the request", r.url)
				}
				return nil
			}
			if err != nil {
				return fmt.Errorf("read the server's event stream: %w", err)
			}
			if err := r.forward(ctx, data, initialize); err != nil {
				return err
			}
			if request && isAnswer(data) {
				answered = true
			}
		}
	}
	return fmt.Errorf("the server %s answered with content type %q, not application/json or text/event-stream", r.url, ct)
}

// headers sets the session id and protocol version the initialize answer
// gave, once it came.
func (r *httpRelay) headers(h http.Header) {
	if p := r.sid.Load(); p != nil {
		h.Set("Mcp-Session-Id", *p)
	}
	if p := r.proto.Load(); p != nil {
		h.Set("Mcp-Protocol-Version", *p)
	}
}

// forward passes one message of the server to the gateway, as it is.
func (r *httpRelay) forward(ctx context.Context, b []byte, initialize bool) error {
	if len(b) > wire.MaxMessage {
		return fmt.Errorf("the server sent a message of more than %d bytes, the tunnel's limit", wire.MaxMessage)
	}
	b = bytes.TrimSpace(b)
	// One JSON object (the gateway decodes it as a JSON-RPC message);
	// anything else would end the whole tunnel there, not this session.
	if len(b) == 0 || b[0] != '{' || !jsontext.Value(b).IsValid() {
		return fmt.Errorf("the server sent something that is not one JSON-RPC message (it starts %s)", framing.Excerpt(b))
	}
	if initialize {
		msg, err := rpcwire.DecodeMessage(b)
		if err != nil {
			return fmt.Errorf("the server's answer to initialize is not a JSON-RPC message: %v", err)
		}
		if resp, ok := msg.(*jsonrpc.Response); ok && resp.Error == nil {
			var res struct {
				ProtocolVersion string `json:"protocolVersion"`
			}
			if json.Unmarshal(resp.Result, &res) == nil && res.ProtocolVersion != "" {
				r.proto.Store(&res.ProtocolVersion)
			}
		}
	}
	return r.s.send(wire.EncodeMsg(r.s.id, b))
}

// close waits for the serve goroutines (the session's context is
// cancelled by then) and ends the server's session (DELETE), as the SDK's
// client does.
func (r *httpRelay) close() {
	r.wg.Wait()
	p := r.sid.Load()
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.s.t.c.o.WriteTimeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodDelete, r.url, nil)
	if err != nil {
		return
	}
	r.headers(hr.Header)
	if resp, err := r.client.Do(hr); err == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}
}
