// Package stdiofront is the stdio front of cmcp serve --stdio: newline-
// delimited JSON-RPC with one agent on stdin and stdout. It reads and
// bounds the agent's lines, answers a bad line with an error that says
// what was wrong, offers each request to the core's fast path first, and
// tracks the requests in both directions so that the end of the agent's
// input ends the session only once what it sent is answered. It speaks to
// the gateway core only through Transport's hooks.
package stdiofront

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
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
)

// maxAgentLine bounds one message from a stdio agent.
const maxAgentLine = 16 << 20

// maxIdleWorkers bounds the goroutines kept waiting for the next fast
// call of a connection (more run while more calls are in flight).
const maxIdleWorkers = 8

// Transport is the transport of `cmcp serve --stdio`: newline-delimited
// JSON-RPC with the agent on the other end. Unlike an upstream's stdout, a
// bad line from the agent does not end the session: it is answered with a
// JSON-RPC error that says what was wrong, and the next line is read.
type Transport struct {
	In  io.ReadCloser
	Out io.WriteCloser
	// Fast, if set, returns the fast path of the connection: it sees every
	// request first, in the order read, and reports whether it took it,
	// with the work to run for it, if any (the gateway's fastpath.go),
	// which runs while the next messages are read. The work calls over
	// once, when the call is over (answered, or cancelled by the agent),
	// from whichever goroutine ends it: it may return before that.
	Fast func(*Conn) func(*jsonrpc.Request) (bool, func(over func()))
	// Passed, if set, sees every request the fast path did not take, just
	// before go-sdk gets it.
	Passed func(*jsonrpc.Request)
	// BadID, if set, sees every line refused for its id (rpcwire.BadID).
	BadID func(line []byte, why string)
	// Ambiguous, if set, sees every request the strict decoder did not
	// take, with its line, before Passed: when it refuses the request it
	// returns the error to answer it with (and the id to answer).
	Ambiguous func(req *jsonrpc.Request, line []byte) (jsonrpc.ID, *jsonrpc.Error, bool)
	// Unanswered, if set, tracks the requests read from the agent until
	// they are answered (the session's end waits for them too).
	Unanswered *Unanswered
	// InputEnded, if set, is called once the agent's input ends (EOF on
	// stdin, or a read error), before the wait for the answers to the
	// requests read (see endOfInput).
	InputEnded func()
	// AgentReqs, if set, tracks the requests written to the agent until
	// their answer is read; the end of the input withdraws the others.
	AgentReqs *AgentRequests
}

// Connect starts reading the agent's lines.
func (t *Transport) Connect(context.Context) (mcp.Connection, error) {
	c := &Conn{t: t, Inbox: rpcwire.NewInbox(), unanswered: t.Unanswered, in: pollableReader(t.In), out: pollableWriter(t.Out),
		work: make(chan func()), closed: make(chan struct{})}
	if c.unanswered == nil {
		c.unanswered = &Unanswered{}
	}
	if t.Fast != nil {
		c.fast = t.Fast(c)
	}
	go c.readLoop()
	return c, nil
}

// Conn is the connection to the agent.
type Conn struct {
	t              *Transport
	*rpcwire.Inbox                // Read
	in             io.ReadCloser  // t.In, reopened by pollableReader if it could be
	out            io.WriteCloser // t.Out, reopened by pollableWriter if it could be
	wmu            sync.Mutex
	fast           func(*jsonrpc.Request) (bool, func(over func()))
	unanswered     *Unanswered
	// work hands a fast call to a waiting worker; idle counts them.
	work      chan func()
	idle      atomic.Int32
	closed    chan struct{}
	closeOnce sync.Once
}

func (c *Conn) readLoop() {
	c.read(bufio.NewReaderSize(c.in, 64<<10), 1)
}

// read reads lines from br (line n next) until the stream ends. A call the
// fast path takes runs in a worker goroutine (dispatch) while reading goes
// on, so that the agent's next messages (a cancellation, a ping, more
// calls) are read while it waits for its upstream. The agent's input is
// read through the poller where it can be (pollableReader): this
// goroutine then waits parked, and the worker it just handed a call to
// runs at once on the same thread.
func (c *Conn) read(br *bufio.Reader, n int) {
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
		msg, strict, code, why := DecodeLine(trimmed)
		if msg == nil && code == jsonrpc.CodeInvalidRequest && c.t.BadID != nil {
			if bad := rpcwire.BadID(trimmed); bad != "" {
				c.t.BadID(trimmed, bad)
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
						id := req.ID
						c.dispatch(func() {
							run(func() {
								if mine { // a duplicate id leaves the first request's entry alone
									c.unanswered.answered(id) // or cancelled by the agent: no answer is due
								}
							})
						})
					}
					continue
				}
			}
			if !strict && c.t.Ambiguous != nil {
				if id, e, refused := c.t.Ambiguous(req, trimmed); refused {
					b, _ := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: e})
					c.WriteLine(b)
					continue
				}
			}
			if c.t.Passed != nil {
				c.t.Passed(req)
			}
			if req.IsCall() {
				c.unanswered.read(req.ID) // go-sdk answers it through Write
			}
		}
		if r, ok := msg.(*jsonrpc.Response); ok && c.t.AgentReqs != nil {
			c.t.AgentReqs.answered(r.ID)
		}
		if !c.Deliver(msg) {
			return
		}
	}
}

// dispatch runs a fast call in a worker: one waiting for work if there is
// one, else a new one. A worker waits for the next call once it is done
// (up to maxIdleWorkers of them: the goroutine and its grown stack are
// reused, instead of a new goroutine per call).
func (c *Conn) dispatch(run func()) {
	select {
	case c.work <- run:
	default:
		go c.worker(run)
	}
}

func (c *Conn) worker(run func()) {
	for {
		run()
		if c.idle.Add(1) > maxIdleWorkers {
			c.idle.Add(-1)
			return
		}
		select {
		case run = <-c.work:
			c.idle.Add(-1)
		case <-c.closed:
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
func (c *Conn) endOfInput(err error) {
	if !c.unanswered.isClosed() { // not the read cut by Close
		if c.t.AgentReqs != nil {
			c.t.AgentReqs.end()
		}
		if c.t.InputEnded != nil {
			c.t.InputEnded()
		}
	}
	c.unanswered.Wait(nil) // Close ends the wait
	c.Fail(err)
}

// unanswered tracks the requests an agent sent until they are answered
// (or, for the fast path, until the call is over: one the agent cancelled
// gets no answer), by id: a request whose id is in use already is
// answered as a duplicate, and only the first counts.
type Unanswered struct {
	mu      sync.Mutex
	n       uint64         // requests read
	ids     map[any]uint64 // the id of each unanswered request -> its n
	changed chan struct{}  // closed when one is answered, if someone waits
	closed  bool           // the connection is closed: no answer will be written
}

func (u *Unanswered) isClosed() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.closed
}

// close says that the connection is closed: waiting is over.
func (u *Unanswered) close() {
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
func (u *Unanswered) read(id jsonrpc.ID) bool {
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

func (u *Unanswered) answered(id jsonrpc.ID) {
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
func (u *Unanswered) Wait(stop <-chan struct{}) int {
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

// AgentRequests tracks the requests the gateway writes to a stdio agent
// (an upstream's sampling, elicitation or roots request, forwarded by
// toAgent) until the agent's answer is read. When the agent's input ends
// (EOF: it is done sending), those it has not answered can never be: end
// withdraws exactly them, and a request written after it is withdrawn at
// once. One whose answer was read before the EOF is left to go-sdk, which
// has it queued.
type AgentRequests struct {
	mu      sync.Mutex
	ended   bool
	pending map[any]*AgentRequest // by request id
}

// AgentRequest is one request toAgent sends: cancel withdraws it.
type AgentRequest struct {
	cancel context.CancelCauseFunc
}

// NewAgentRequest is a request to the agent that cancel withdraws.
func NewAgentRequest(cancel context.CancelCauseFunc) *AgentRequest {
	return &AgentRequest{cancel: cancel}
}

// ErrInputEnded is the cause with which AgentRequests withdraws a
// request.
var ErrInputEnded = errors.New("the agent closed its input")

type agentRequestKey struct{}

// WithAgentRequest marks ctx, the context of a request to the agent, as
// req, which req.cancel withdraws (with ErrInputEnded) when the agent
// can no longer answer it.
func WithAgentRequest(ctx context.Context, req *AgentRequest) context.Context {
	return context.WithValue(ctx, agentRequestKey{}, req)
}

// sent notes a request about to be written with ctx.
func (r *AgentRequests) sent(ctx context.Context, id jsonrpc.ID) {
	req, _ := ctx.Value(agentRequestKey{}).(*AgentRequest)
	if req == nil || !id.IsValid() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		req.cancel(ErrInputEnded)
		return
	}
	if r.pending == nil {
		r.pending = map[any]*AgentRequest{}
	}
	r.pending[id.Raw()] = req
}

// done forgets req, whose caller has its outcome.
func (r *AgentRequests) Done(req *AgentRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, p := range r.pending {
		if p == req {
			delete(r.pending, id)
		}
	}
}

// answered notes that the agent's answer to id was read.
func (r *AgentRequests) answered(id jsonrpc.ID) {
	if !id.IsValid() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pending, id.Raw())
}

// end notes the end of the agent's input and withdraws the requests it did
// not answer.
func (r *AgentRequests) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
	for _, req := range r.pending {
		req.cancel(ErrInputEnded)
	}
	r.pending = nil
}

func (r *AgentRequests) HasEnded() bool {
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

// DecodeLine decodes one line from the agent; strict reports that
// rpcwire.DecodeFast took it (it is valid JSON in the strict sense).
// Otherwise msg is nil with a JSON-RPC error code and the reason.
func DecodeLine(b []byte) (msg jsonrpc.Message, strict bool, code int64, why string) {
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

func (c *Conn) reject(id json.RawMessage, code int64, msg string) {
	if id == nil {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: code, Message: msg}})
	c.WriteLine(b)
}

func (c *Conn) WriteLine(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.out.Write(append(b, '\n'))
	return err
}

func (c *Conn) Write(ctx context.Context, msg jsonrpc.Message) error {
	switch m := msg.(type) {
	case *jsonrpc.Response:
		defer c.unanswered.answered(m.ID) // once written (or not writable)
	case *jsonrpc.Request:
		if m.IsCall() && c.t.AgentReqs != nil {
			c.t.AgentReqs.sent(ctx, m.ID)
		}
	}
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	return c.WriteLine(b)
}

// TestHookAgentRead, if set, sees each message go-sdk reads from a stdio
// agent, before go-sdk has it. For tests only (internal/server's delay
// what go-sdk reads to order it against the agent's EOF); set it before
// the session starts.
var TestHookAgentRead func(jsonrpc.Message)

func (c *Conn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Inbox.Read(ctx)
	if TestHookAgentRead != nil && err == nil {
		TestHookAgentRead(msg)
	}
	return msg, err
}

func (c *Conn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	c.unanswered.close()
	if c.Inbox.Close() {
		c.in.Close()
		c.out.Close()
	}
	return nil
}

func (c *Conn) SessionID() string { return "" }
