package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/pkg/framing"
)

// childTransport is an mcp.Transport over a spawned child's stdin and stdout,
// with strict framing: one JSON-RPC object per line. A line that is not one
// is fatal for the child (the stream is never resynchronised): the read
// fails, the child is killed and the fault is recorded.
//
// The read loop itself takes the responses to raw calls (Conn.RawCall) and
// the messages the gateway intercepts (ConnectOptions.Intercept) off the
// wire, in order, before anything reaches the MCP client.
type childTransport struct {
	child     *Child
	intercept func(jsonrpc.Message) bool
	conn      *childConn // set by Connect
	rawPrefix string     // "" = rawIDPrefix
}

func (t *childTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	prefix := t.rawPrefix
	if prefix == "" {
		prefix = rawIDPrefix
	}
	c := &childConn{child: t.child, Inbox: rpcwire.NewInbox(), intercept: t.intercept, raw: rpcwire.Pending{Prefix: prefix}}
	if l := t.child.hooks.Log; l != nil {
		// A late answer (its call was cancelled or timed out) is normal;
		// one to an id never sent, or a second one, is the child's fault.
		// Either way it is dropped, and said so.
		var last atomic.Int64 // unix nanoseconds of the last warning: one a second at most
		var quiet atomic.Int64
		c.raw.Dropped = func(id string) {
			now := time.Now().UnixNano()
			if l0 := last.Load(); now-l0 < int64(time.Second) || !last.CompareAndSwap(l0, now) {
				quiet.Add(1)
				return
			}
			l.Warn("upstream answered a request that no longer waits (it ended, was cancelled, was answered already, or was never sent); the answer was dropped",
				"upstream", t.child.name, "id", framing.Excerpt([]byte(id)), "dropped_since_last_warning", quiet.Swap(0))
		}
	}
	t.conn = c
	go c.readLoop()
	return c, nil
}

type childConn struct {
	child          *Child
	*rpcwire.Inbox // Read
	intercept      func(jsonrpc.Message) bool
	raw            rpcwire.Pending
	stdoutEnded    atomic.Bool // the child's stdout ended (EOF): it exited, or closed it
}

func (c *childConn) readLoop() {
	r := framing.NewReader(c.child.stdout, maxFrame)
	r.AllowInvalidUTF8 = true // notUTF8 decides about such a line
	// Its read buffer serves the next child once this one's stdout is done.
	defer r.Release()
	for {
		line, err := r.Read()
		var msg jsonrpc.Message
		if err == nil {
			// Before decoding: go-sdk's decoder takes such text in a
			// result as it is, or replaces it with U+FFFD.
			if rpcwire.MayBeNotUTF8(line) && c.notUTF8(line) {
				continue
			}
			var strict bool
			if msg, strict = rpcwire.DecodeFast(line); !strict {
				msg, err = jsonrpc.DecodeMessage(line) // go-sdk's decoder decides (rpcwire.DecodeMessage)
			}
			if resp, ok := msg.(*jsonrpc.Response); ok && strict && strings.HasPrefix(rawID(resp), c.raw.Prefix) {
				resp.Extra = checkedMark{} // a raw call's answer, checked whole (WithChecked)
			}
			if err != nil {
				de := &DesyncError{Offset: r.Offset() - int64(len(line)) - 1, Excerpt: framing.Excerpt(line), Cause: err}
				de.Why = nullID(line)
				// go-sdk's decoding errors are *jsonrpc.Error values
				// (-32600 "invalid request"): the upstream did not answer
				// with them, so they must not pass for its answer.
				var we *jsonrpc.Error
				if errors.As(err, &we) {
					de.Cause = errors.New(we.Error())
				}
				err = de
			}
		}
		var fd *framing.DesyncError
		if errors.As(err, &fd) {
			err = &DesyncError{Offset: fd.Offset, Excerpt: fd.Excerpt, Cause: fd}
		}
		if err == nil {
			if resp, ok := msg.(*jsonrpc.Response); ok && c.raw.Deliver(resp) {
				continue
			}
			if c.intercept != nil && c.intercept(msg) {
				continue
			}
			if c.Deliver(msg) {
				continue
			}
			c.raw.Fail(fmt.Errorf("upstream %q: connection closed", c.child.name))
			return
		}
		var de *DesyncError
		if errors.As(err, &de) {
			de.Upstream = c.child.name
			c.child.fail(de)
		} else if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
			c.stdoutEnded.Store(true)
			err = c.child.exitFault()
		} else {
			err = fmt.Errorf("upstream %q: read stdout: %w", c.child.name, err)
			c.child.fail(err)
		}
		c.raw.Fail(err)
		c.Fail(err)
		return
	}
}

// rawID is a response's id if it is a string, else "".
func rawID(resp *jsonrpc.Response) string {
	id, _ := resp.ID.Raw().(string)
	return id
}

// notUTF8 takes a line that is a JSON-RPC message but for text that is
// not UTF-8 (bytes that are not, or a lone surrogate escape: a server that
// echoes what it was given, or cuts a string between the halves of a
// pair), which fails only the request it answers, not the child: what a
// call makes a server write must not stop a child other agents' calls are
// waiting on. An answer to a raw call fails that call (BadAnswerError),
// one to a request of the MCP client session is turned into an error
// response; a request from the server is answered with an error; a
// notification is dropped. It reports false, and the line is fatal for
// the child, when it is not such a message.
func (c *childConn) notUTF8(line []byte) bool {
	_, what, bad := rpcwire.NotUTF8(line)
	if !bad {
		return false
	}
	var m struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      jsontext.Value  `json:"id"`
		Method  *jsontext.Value `json:"method"`
		Result  jsontext.Value  `json:"result"`
		Error   jsontext.Value  `json:"error"`
	}
	if jsonv2.Unmarshal(line, &m, jsontext.AllowInvalidUTF8(true), jsontext.AllowDuplicateNames(true)) != nil || m.JSONRPC != "2.0" {
		return false
	}
	var id jsonrpc.ID
	switch {
	case len(m.ID) == 0 || string(m.ID) == "null":
	case m.ID[0] == '"':
		var s string
		if jsonv2.Unmarshal(m.ID, &s) != nil {
			return false
		}
		id, _ = jsonrpc.MakeID(s)
	default:
		n, err := strconv.ParseInt(string(m.ID), 10, 64)
		if err != nil || n > 1<<53 || n < -(1<<53) {
			return false
		}
		id, _ = jsonrpc.MakeID(float64(n))
	}
	part := "its result"
	if len(m.Error) > 0 {
		part = "its error"
	}
	log := c.child.hooks.Log
	switch {
	case m.Method != nil && id.IsValid():
		// A request from the server (sampling, say): answered, so
		// that it does not wait.
		b, _ := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest,
			Message: "cmcp: the request's text is not UTF-8 (" + what + "); it was not forwarded"}})
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), cancelWriteWait)
			defer cancel()
			_ = c.child.write(ctx, b)
		}()
		part = "a request it sent"
	case m.Method != nil:
		part = "a notification"
	case !id.IsValid():
		return false
	default:
		err := &BadAnswerError{Upstream: c.child.name, Why: fmt.Sprintf("%s holds %s", part, what)}
		if s, ok := id.Raw().(string); ok && strings.HasPrefix(s, rawIDPrefix) {
			if !c.raw.FailOne(s, err) && c.raw.Dropped != nil {
				c.raw.Dropped(s)
			}
		} else if !c.Deliver(&jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: codeUpstreamFailed, Message: "cmcp: " + err.Error()}}) {
			return false
		}
	}
	if log != nil {
		log.Warn("upstream wrote a message whose text is not UTF-8; only that message failed, the child was kept",
			"upstream", c.child.name, "message", part, "what", what)
	}
	return true
}

// codeUpstreamFailed is the gateway's CodeUpstreamFailed (-32067), given
// to the MCP client session for an answer of the upstream it cannot pass on.
const codeUpstreamFailed = -32067

// BadAnswerError says that an upstream answered one request with a message
// it can be held to but not passed on (its text is not UTF-8): that
// request failed, the connection goes on.
type BadAnswerError struct {
	Upstream string
	Why      string
}

func (e *BadAnswerError) Error() string {
	return fmt.Sprintf("upstream %q answered with a message whose text is not UTF-8 (%s), which is not valid JSON (RFC 8259 §8.1): the answer was not forwarded; the call failed, the upstream was kept", e.Upstream, e.Why)
}

// nullID says why a line from the server whose "id" is null is not taken,
// or "" if it is not such a line. JSON-RPC answers with a null id a
// request it could not read; every request the gateway sends is valid
// JSON-RPC in UTF-8, so the server does not read what it is sent.
func nullID(line []byte) string {
	var m struct {
		ID     jsontext.Value `json:"id"`
		Method jsontext.Value `json:"method"`
		Error  *struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if jsonv2.Unmarshal(line, &m, jsontext.AllowInvalidUTF8(true), jsontext.AllowDuplicateNames(true)) != nil || string(m.ID) != "null" || len(m.Method) > 0 {
		return ""
	}
	if m.Error != nil {
		return fmt.Sprintf(`answered with "id": null (its error %d %s, not tied to any request): it could not read a request the gateway sent, though every one is valid JSON-RPC`,
			m.Error.Code, framing.Excerpt([]byte(m.Error.Message)))
	}
	return `answered with "id": null and a result, which answers no request`
}

func (c *childConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	if err := c.child.write(ctx, b); err != nil {
		return fmt.Errorf("upstream %q: write stdin: %w", c.child.name, err)
	}
	return nil
}

func (c *childConn) Close() error {
	c.Inbox.Close()
	// go-sdk closes the connection when a write fails: the calls that
	// follow learn why, if the gateway stopped the child.
	err := fmt.Errorf("upstream %q: connection closed", c.child.name)
	if p := c.child.fault.Load(); p != nil {
		err = *p
	}
	c.raw.Fail(err)
	if !c.child.handshook.Load() {
		// go-sdk closes the connection when the handshake fails: Connect
		// stops the child then, once it has recorded why.
		return nil
	}
	return c.child.Stop()
}

func (c *childConn) SessionID() string { return "" }

// DesyncError says that an upstream wrote something on stdout that is not a
// JSON-RPC message. The child is killed; the next use respawns it.
type DesyncError struct {
	Upstream string
	Offset   int64  // byte offset of the offending line in the child's stdout
	Excerpt  string // the start of the offending line, quoted
	Cause    error
	// Why, if set, says what is wrong with a line that is JSON-RPC in
	// form (an answer with "id": null).
	Why string
}

func (e *DesyncError) Error() string {
	if errors.Is(e.Cause, framing.ErrTooLarge) {
		return fmt.Sprintf("upstream %q wrote a line longer than the limit of %d MiB for one message on stdout at byte %d (it starts %s): the child was stopped and will be respawned, re-measured, on the next call; each JSON-RPC message a stdio MCP server writes, results included, must fit in %d MiB",
			e.Upstream, maxFrame>>20, e.Offset, e.Excerpt, maxFrame>>20)
	}
	if e.Why != "" {
		return fmt.Sprintf("upstream %q %s (on stdout at byte %d): the child was stopped, since its answers can no longer be matched to requests, and will be respawned, re-measured, on the next call",
			e.Upstream, e.Why, e.Offset)
	}
	return fmt.Sprintf("upstream %q wrote a line that is not a JSON-RPC message on stdout at byte %d (it starts %s): the child was stopped and will be respawned, re-measured, on the next call; a stdio MCP server must write only JSON-RPC to stdout and its logs to stderr",
		e.Upstream, e.Offset, e.Excerpt)
}

func (e *DesyncError) Unwrap() error { return e.Cause }

// maxFrame bounds one JSON-RPC message read from a child (the go-sdk
// default); DesyncError names it in MiB.
const maxFrame = 16 << 20
