package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
)

// maxAgentLine bounds one message from a stdio agent.
const maxAgentLine = 16 << 20

// resumeAfter bounds how long a fast call holds up reading the agent's
// next messages before it is on its way to the upstream.
const resumeAfter = 200 * time.Microsecond

// agentStdio is the transport of `cmcp serve --stdio`: newline-delimited
// JSON-RPC with the agent on the other end. Unlike an upstream's stdout, a
// bad line from the agent does not end the session: it is answered with a
// JSON-RPC error that says what was wrong, and the next line is read.
type agentStdio struct {
	in  io.ReadCloser
	out io.WriteCloser
	// fast, if set, returns the fast path of the connection: it sees every
	// request first and reports whether it took it, with the work to run
	// for it, if any (fastpath.go). The work calls resume once it no
	// longer needs to hold up reading.
	fast func(*agentConn) func(*jsonrpc.Request) (bool, func(resume func()))
	// passed, if set, sees every request the fast path did not take, just
	// before go-sdk gets it.
	passed func(*jsonrpc.Request)
	// badID, if set, sees every line refused for its id (rpcwire.BadID).
	badID func(line []byte, why string)
	// ambiguous, if set, sees every request the strict decoder did not
	// take, with its line, before passed: when it refuses the request it
	// returns the error to answer it with (and the id to answer).
	ambiguous func(req *jsonrpc.Request, line []byte) (jsonrpc.ID, *jsonrpc.Error, bool)
	// unanswered, if set, tracks the requests read from the agent until
	// they are answered (the session's end waits for them too).
	unanswered *unanswered
	// inputEnded, if set, is called once the agent's input ends (EOF on
	// stdin, or a read error), before the wait for the answers to the
	// requests read (see endOfInput).
	inputEnded func()
	// agentReqs, if set, tracks the requests written to the agent until
	// their answer is read; the end of the input withdraws the others.
	agentReqs *agentRequests
}

func (t *agentStdio) Connect(context.Context) (mcp.Connection, error) {
	c := &agentConn{t: t, Inbox: rpcwire.NewInbox(), unanswered: t.unanswered}
	if c.unanswered == nil {
		c.unanswered = &unanswered{}
	}
	if t.fast != nil {
		c.fast = t.fast(c)
	}
	go c.readLoop()
	return c, nil
}

type agentConn struct {
	t              *agentStdio
	*rpcwire.Inbox // Read
	wmu            sync.Mutex
	fast           func(*jsonrpc.Request) (bool, func(resume func()))
	unanswered     *unanswered
}

func (c *agentConn) readLoop() {
	c.read(bufio.NewReaderSize(c.t.in, 64<<10), 1)
}

// read reads lines from br (line n next) until the stream ends. When the
// fast path takes a call, this goroutine runs the call and reading goes on
// in a new goroutine: the call starts at once, instead of waiting for the
// scheduler while this goroutine sits in a blocking read of the agent's
// stdin (at one call at a time that wait was about 12 µs of the gateway's
// added latency). The new reader starts once the call is on its way to
// the upstream (upstream.WithWaiting), so that starting it is not on the
// call's path either, or after resumeAfter if the call takes longer to
// get there (a policy refusal, an upstream to start, a slow disk).
func (c *agentConn) read(br *bufio.Reader, n int) {
	for ; ; n++ {
		line, tooLong, err := readLine(br, maxAgentLine)
		if err != nil {
			c.endOfInput(err)
			return
		}
		if tooLong {
			c.reject(nil, jsonrpc.CodeInvalidRequest, fmt.Sprintf("cmcp: line %d is longer than %d bytes and was dropped", n, maxAgentLine))
			continue
		}
		trimmed := bytes.TrimSpace(line)
		if len(trimmed) == 0 {
			continue
		}
		msg, strict, code, why := decodeAgentLine(trimmed)
		if msg == nil && code == jsonrpc.CodeInvalidRequest && c.t.badID != nil {
			if bad := rpcwire.BadID(trimmed); bad != "" {
				c.t.badID(trimmed, bad)
			}
		}
		if msg == nil {
			c.reject(idOf(trimmed), code, fmt.Sprintf("cmcp: line %d: %s; send one JSON-RPC 2.0 object per line", n, why))
			continue
		}
		// Only a message decoded strictly (rpcwire.DecodeFast: valid
		// UTF-8, no duplicate names) is offered to the fast path, which
		// relies on it; the others are go-sdk's to answer.
		if req, ok := msg.(*jsonrpc.Request); ok {
			if strict && c.fast != nil {
				if took, run := c.fast(req); took {
					if run != nil {
						mine := c.unanswered.read(req.ID)
						next := n + 1
						resume := sync.OnceFunc(func() { go c.read(br, next) })
						t := time.AfterFunc(resumeAfter, resume)
						run(func() {
							t.Stop()
							resume()
						})
						if mine { // a duplicate id leaves the first request's entry alone
							c.unanswered.answered(req.ID) // or cancelled by the agent: no answer is due
						}
						t.Stop()
						resume()
						return
					}
					continue
				}
			}
			if !strict && c.t.ambiguous != nil {
				if id, e, refused := c.t.ambiguous(req, trimmed); refused {
					b, _ := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: e})
					c.writeLine(b)
					continue
				}
			}
			if c.t.passed != nil {
				c.t.passed(req)
			}
			if req.IsCall() {
				c.unanswered.read(req.ID) // go-sdk answers it through Write
			}
		}
		if r, ok := msg.(*jsonrpc.Response); ok && c.t.agentReqs != nil {
			c.t.agentReqs.answered(r.ID)
		}
		if !c.Deliver(msg) {
			return
		}
	}
}

// endOfInput ends the agent's input once the requests it sent are
// answered. EOF on stdin means that the agent is done sending (`printf ...
// | cmcp serve --stdio`; an MCP client that closes stdin to end the
// session), not that it stopped reading stdout. go-sdk, told at once, would
// end the session at once: it cancels the requests in flight, writes none
// of their answers, and drops the ones it has not dispatched yet, such as
// a tools/call read with the initialize before it. So go-sdk is told only
// once every request read is answered, or once the connection is closed:
// the session ended otherwise (cmcp serve's shutdown, at
// server.shutdown_grace after the EOF, cuts and answers the calls still
// running first).
func (c *agentConn) endOfInput(err error) {
	if !c.unanswered.isClosed() { // not the read cut by Close
		if c.t.agentReqs != nil {
			c.t.agentReqs.end()
		}
		if c.t.inputEnded != nil {
			c.t.inputEnded()
		}
	}
	c.unanswered.wait(nil) // Close ends the wait
	c.Fail(err)
}

// unanswered tracks the requests an agent sent until they are answered
// (or, for the fast path, until the call is over: one the agent cancelled
// gets no answer), by id: a request whose id is in use already is
// answered as a duplicate, and only the first counts.
type unanswered struct {
	mu      sync.Mutex
	n       uint64         // requests read
	ids     map[any]uint64 // the id of each unanswered request -> its n
	changed chan struct{}  // closed when one is answered, if someone waits
	closed  bool           // the connection is closed: no answer will be written
}

func (u *unanswered) isClosed() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.closed
}

// close says that the connection is closed: waiting is over.
func (u *unanswered) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	if u.changed != nil {
		close(u.changed)
		u.changed = nil
	}
}

// read notes a request read; it reports whether the request is tracked
// (false for no id, or an id an unanswered request has already).
func (u *unanswered) read(id jsonrpc.ID) bool {
	if !id.IsValid() {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.n++
	if u.ids == nil {
		u.ids = map[any]uint64{}
	}
	if _, dup := u.ids[id.Raw()]; dup {
		return false
	}
	u.ids[id.Raw()] = u.n
	return true
}

func (u *unanswered) answered(id jsonrpc.ID) {
	if !id.IsValid() {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.ids[id.Raw()]; !ok {
		return
	}
	delete(u.ids, id.Raw())
	if u.changed != nil {
		close(u.changed)
		u.changed = nil
	}
}

// wait returns once every request read before it was called is answered,
// the connection is closed, or stop is closed; it returns how many of them
// are not answered.
func (u *unanswered) wait(stop <-chan struct{}) int {
	u.mu.Lock()
	upTo := u.n
	u.mu.Unlock()
	for {
		u.mu.Lock()
		left := 0
		for _, n := range u.ids {
			if n <= upTo {
				left++
			}
		}
		if left == 0 || u.closed {
			u.mu.Unlock()
			return left
		}
		if u.changed == nil {
			u.changed = make(chan struct{})
		}
		changed := u.changed
		u.mu.Unlock()
		select {
		case <-changed:
		case <-stop:
			return left
		}
	}
}

// agentRequests tracks the requests the gateway writes to a stdio agent
// (an upstream's sampling, elicitation or roots request, forwarded by
// toAgent) until the agent's answer is read. When the agent's input ends
// (EOF: it is done sending), those it has not answered can never be: end
// withdraws exactly them, and a request written after it is withdrawn at
// once. One whose answer was read before the EOF is left to go-sdk, which
// has it queued.
type agentRequests struct {
	mu      sync.Mutex
	ended   bool
	pending map[any]*agentRequest // by request id
}

// agentRequest is one request toAgent sends: cancel withdraws it.
type agentRequest struct {
	cancel context.CancelCauseFunc
}

// errAgentInputEnded is the cause with which agentRequests withdraws a
// request.
var errAgentInputEnded = errors.New("the agent closed its input")

type agentRequestKey struct{}

// withAgentRequest marks ctx, the context of a request to the agent, as
// req, which req.cancel withdraws (with errAgentInputEnded) when the agent
// can no longer answer it.
func withAgentRequest(ctx context.Context, req *agentRequest) context.Context {
	return context.WithValue(ctx, agentRequestKey{}, req)
}

// sent notes a request about to be written with ctx.
func (r *agentRequests) sent(ctx context.Context, id jsonrpc.ID) {
	req, _ := ctx.Value(agentRequestKey{}).(*agentRequest)
	if req == nil || !id.IsValid() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		req.cancel(errAgentInputEnded)
		return
	}
	if r.pending == nil {
		r.pending = map[any]*agentRequest{}
	}
	r.pending[id.Raw()] = req
}

// done forgets req, whose caller has its outcome.
func (r *agentRequests) done(req *agentRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, p := range r.pending {
		if p == req {
			delete(r.pending, id)
		}
	}
}

// answered notes that the agent's answer to id was read.
func (r *agentRequests) answered(id jsonrpc.ID) {
	if !id.IsValid() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pending, id.Raw())
}

// end notes the end of the agent's input and withdraws the requests it did
// not answer.
func (r *agentRequests) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
	for _, req := range r.pending {
		req.cancel(errAgentInputEnded)
	}
	r.pending = nil
}

func (r *agentRequests) hasEnded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

// readLine reads one line; a line over max is consumed and reported.
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > max {
			tooLong = true
		} else {
			line = append(line, chunk...)
		}
		switch {
		case err == nil:
			return line, tooLong, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return line, tooLong, nil
		default:
			return nil, false, err
		}
	}
}

// decodeAgentLine decodes one line from the agent; strict reports that
// rpcwire.DecodeFast took it (it is valid JSON in the strict sense).
// Otherwise msg is nil with a JSON-RPC error code and the reason.
func decodeAgentLine(b []byte) (msg jsonrpc.Message, strict bool, code int64, why string) {
	if msg, ok := rpcwire.DecodeFast(b); ok { // one valid JSON object: no need to scan it twice
		if req, isReq := msg.(*jsonrpc.Request); isReq && !req.ID.IsValid() && !strings.HasPrefix(req.Method, "notifications/") {
			// An explicit null id: a request go-sdk would take for a
			// notification and answer never.
			if why := rpcwire.BadID(b); why != "" {
				return nil, false, jsonrpc.CodeInvalidRequest, why
			}
		}
		return msg, true, 0, ""
	}
	if why := rpcwire.BadID(b); why != "" && json.Valid(b) && b[0] == '{' {
		return nil, false, jsonrpc.CodeInvalidRequest, why
	}
	switch {
	case !json.Valid(b):
		return nil, false, jsonrpc.CodeParseError, "not valid JSON"
	case b[0] == '[':
		return nil, false, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are not supported by MCP 2025-06-18 and later"
	case b[0] != '{':
		return nil, false, jsonrpc.CodeInvalidRequest, "not a JSON object"
	}
	msg, err := rpcwire.DecodeMessage(b)
	if err != nil {
		return nil, false, jsonrpc.CodeInvalidRequest, "not a JSON-RPC 2.0 message: " + err.Error()
	}
	return msg, false, 0, ""
}

// idOf returns the "id" of a malformed request when it can be read, so the
// error reaches the right caller; otherwise null.
func idOf(b []byte) json.RawMessage {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(b, &m) == nil && len(m.ID) > 0 {
		return m.ID
	}
	return nil
}

func (c *agentConn) reject(id json.RawMessage, code int64, msg string) {
	if id == nil {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: code, Message: msg}})
	c.writeLine(b)
}

func (c *agentConn) writeLine(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.t.out.Write(append(b, '\n'))
	return err
}

func (c *agentConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	switch m := msg.(type) {
	case *jsonrpc.Response:
		defer c.unanswered.answered(m.ID) // once written (or not writable)
	case *jsonrpc.Request:
		if m.IsCall() && c.t.agentReqs != nil {
			c.t.agentReqs.sent(ctx, m.ID)
		}
	}
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	return c.writeLine(b)
}

// TestHookAgentRead, if set, sees each message go-sdk reads from a stdio
// agent, before go-sdk has it. For tests only (internal/server's delay
// what go-sdk reads to order it against the agent's EOF); set it before
// the session starts.
var TestHookAgentRead func(jsonrpc.Message)

func (c *agentConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Inbox.Read(ctx)
	if TestHookAgentRead != nil && err == nil {
		TestHookAgentRead(msg)
	}
	return msg, err
}

func (c *agentConn) Close() error {
	c.unanswered.close()
	if c.Inbox.Close() {
		c.t.in.Close()
		c.t.out.Close()
	}
	return nil
}

func (c *agentConn) SessionID() string { return "" }
