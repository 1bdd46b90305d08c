package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	segjson "github.com/segmentio/encoding/json"

	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

// The fast path: a front end that owns its wire (the stdio front, the
// Streamable HTTP front) answers tools/call itself, straight from the
// call pipeline, instead of through go-sdk's server session, which
// decodes, dispatches and re-encodes every message. Everything else an
// agent sends, and every call made before the session is initialised,
// still goes to go-sdk. Progress, logging, sampling and elicitation during
// a fast call reach the agent exactly as before (see live.route).

// decodeFastCall decodes a tools/call's params, or reports false when
// go-sdk must answer the request (anything unusual: its errors are the
// reference). params must be valid JSON in the strict sense (RFC 7493),
// as in a message rpcwire.DecodeFast took, which both fronts make sure
// of: its members are found without validating or decoding it again
// (rpcwire.EachMember).
func decodeFastCall(params json.RawMessage) (toolCall, bool) {
	if len(params) == 0 || params[0] != '{' {
		return toolCall{}, false
	}
	var call toolCall
	var name, meta []byte
	if !rpcwire.EachMember(params, func(n, v []byte) {
		switch string(n) {
		case "name":
			name = v
		case "arguments":
			call.Args = v
		case "_meta":
			meta = v
		}
	}) {
		return toolCall{}, false
	}
	if len(name) == 0 || name[0] != '"' || jsonv2.Unmarshal(name, &call.Name) != nil {
		return toolCall{}, false
	}
	if len(call.Args) > 0 && call.Args[0] != '{' {
		return toolCall{}, false
	}
	// _meta stays the bytes the agent sent (numbers beyond float64, member
	// order, "<>&" unescaped): the upstream gets them as they are, with
	// only the progress token replaced by the gateway's (spliceMeta), and
	// the agent gets its own token back, as it spelled it, on progress.
	switch {
	case len(meta) == 0 || string(meta) == "null":
	case meta[0] != '{':
		return toolCall{}, false
	default:
		var tok []byte
		if !rpcwire.EachMember(meta, func(n, v []byte) {
			if string(n) == "progressToken" {
				tok = v
			}
		}) {
			return toolCall{}, false // a member name with an escape (it may spell progressToken): go-sdk decodes it
		}
		call.Meta = meta
		if len(tok) > 0 && string(tok) != "null" {
			call.Progress = json.RawMessage(tok)
		}
	}
	return call, true
}

// fastCalls are the fast path's in-flight calls of one connection, by
// request id, so that notifications/cancelled reaches them.
type fastCalls struct {
	mu sync.Mutex
	m  map[jsonrpc.ID]context.CancelFunc
}

// add registers an in-flight call; it reports false if the id is already
// in flight.
func (f *fastCalls) add(id jsonrpc.ID, cancel context.CancelFunc) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[jsonrpc.ID]context.CancelFunc{}
	}
	if _, dup := f.m[id]; dup {
		return false
	}
	f.m[id] = cancel
	return true
}

func (f *fastCalls) remove(id jsonrpc.ID) {
	f.mu.Lock()
	delete(f.m, id)
	f.mu.Unlock()
}

// cancel handles notifications/cancelled: it reports whether the request
// was a fast call (which is then cancelled).
func (f *fastCalls) cancel(params json.RawMessage) bool {
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil {
		return false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	if err != nil {
		return false
	}
	f.mu.Lock()
	c := f.m[id]
	delete(f.m, id)
	f.mu.Unlock()
	if c == nil {
		return false
	}
	c()
	return true
}

// encodeResponse is the JSON-RPC response to a fast call: the result bytes
// spliced in unchanged, or the error. It always gives a response: if the
// error cannot be encoded (its data is not JSON), the agent gets a gateway
// fault saying so instead of no answer.
func encodeResponse(id jsonrpc.ID, result json.RawMessage, err error) []byte {
	if err != nil {
		var we *jsonrpc.Error
		if !errors.As(err, &we) {
			we = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
		}
		b, eerr := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: we})
		if eerr != nil {
			b, _ = jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: fault(CodeUpstreamFailed, "the upstream's error could not be encoded: %v", eerr)})
		}
		return b
	}
	b := make([]byte, 0, len(result)+64)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	switch v := id.Raw().(type) { // a call's id is a string or an integer
	case int64:
		b = strconv.AppendInt(b, v, 10)
	default:
		idb, _ := json.Marshal(v)
		b = append(b, idb...)
	}
	b = append(b, `,"result":`...)
	b = append(b, result...)
	return append(b, '}')
}

// stdioFast is the stdio front's fast path: it takes tools/call requests
// of an initialised session, returning the call to run (the read loop runs
// it), and the cancellations of those calls; it reports whether it took
// the request.
func (s *session) stdioFast(c *stdiofront.Conn) func(*jsonrpc.Request) (bool, func(func())) {
	calls := &s.fast
	return func(req *jsonrpc.Request) (bool, func(func())) {
		switch req.Method {
		case "notifications/cancelled":
			return !req.IsCall() && calls.cancel(req.Params), nil
		case "tools/call":
		default:
			return false, nil
		}
		if !req.IsCall() || s.downSession() == nil {
			return false, nil
		}
		call, ok := decodeFastCall(req.Params)
		call.ID = req.ID
		if !ok {
			return false, nil
		}
		cctx, cancel := context.WithCancel(s.ctx)
		if !calls.add(req.ID, cancel) {
			cancel()
			return false, nil // a duplicate in-flight id: go-sdk answers it
		}
		s.g.fastPath.Add(1)
		// In flight until the response is written, not only until the
		// pipeline returns: shutdown, and the session's end, wait for both.
		s.g.inflight.Add(1)
		s.answering.Add(1)
		return true, func(resume func()) {
			defer s.g.inflight.Done()
			defer cancel()
			// Out of the in-flight table before the answer is written: the
			// agent may send its next request with this id as soon as it
			// reads the answer (TestReusedIDIsNotInFlight).
			done := sync.OnceFunc(func() { calls.remove(req.ID) })
			defer done()
			var appendResult func(undelivered string)
			res, err := s.relay(upstream.WithWaiting(context.WithValue(cctx, stdioKey{}, c), resume), call, &appendResult)
			done()
			// Cancelled by the agent: no response. Cut by the session's
			// end: err says why, and the connection is still open.
			if cctx.Err() == nil || sessionEndOf(cctx) != nil {
				_ = c.WriteLine(encodeResponse(req.ID, res, err))
			}
			s.answering.Done()
			if appendResult != nil {
				appendResult("")
			}
		}
	}
}

// recordUndecodableCall records a tools/call whose params go-sdk cannot
// decode (not an object, a name that is not a string, no params): go-sdk
// answers it (-32602 or -32600) before the gateway's middleware sees it,
// so that without this record it would have none. It decodes as go-sdk
// does (segmentio/encoding, member names matched by case); a call go-sdk
// can decode reaches the pipeline, which records it.
func (s *session) recordUndecodableCall(req *jsonrpc.Request) {
	if req.Method != "tools/call" || !req.IsCall() {
		return
	}
	var p *mcp.CallToolParamsRaw
	var err error
	if len(req.Params) > 0 {
		dec := segjson.NewDecoder(bytes.NewReader(req.Params))
		dec.DontMatchCaseInsensitiveStructFields()
		err = dec.Decode(&p)
	}
	if err == nil && p != nil {
		return
	}
	// The decoder's error is left out: it may quote the params.
	s.recordRefusedCall(req.ID, toolNameOf(req.Params), "invalid params: tools/call params must be an object whose name is a string; the agent was answered with a JSON-RPC error")
}

// refuseAmbiguousCall refuses a tools/call (as go-sdk reads req) whose
// message, line, repeats a member name: go-sdk takes the last of them,
// other readers the first, so the call decided and recorded need not be
// the call forwarded ("name" twice went upstream as the second tool,
// skipping the fast path and its request_id). It records the call as
// refused and returns the error to answer with and the id to answer (none
// when the id is what is repeated); ok is false when no name is repeated.
// Only a message the strict decoder (rpcwire.DecodeFast) refused can
// repeat one.
func (s *session) refuseAmbiguousCall(req *jsonrpc.Request, line []byte) (id jsonrpc.ID, e *jsonrpc.Error, ok bool) {
	if req.Method != "tools/call" || !req.IsCall() {
		return jsonrpc.ID{}, nil, false
	}
	where, dup := rpcwire.DuplicateName(line)
	if !dup {
		if where, what, bad := rpcwire.NotUTF8(line); bad {
			code, kind := int64(jsonrpc.CodeInvalidParams), "invalid params"
			if !strings.HasPrefix(string(where), "/params/") {
				code, kind = jsonrpc.CodeInvalidRequest, "invalid request"
			}
			why := notUTF8Why(where, what)
			s.recordRefusedCall(req.ID, toolNameOf(req.Params), kind+": "+why+"; the agent was answered with a JSON-RPC error")
			return req.ID, &jsonrpc.Error{Code: code, Message: "cmcp: " + why}, true
		}
		return jsonrpc.ID{}, nil, false
	}
	id, code, kind := req.ID, int64(jsonrpc.CodeInvalidParams), "invalid params"
	if !strings.HasPrefix(where, "/params/") {
		code, kind = jsonrpc.CodeInvalidRequest, "invalid request"
	}
	if where == "/id" {
		id = jsonrpc.ID{}
	}
	tool := toolNameOf(req.Params)
	if where == "/params" || where == "/params/name" {
		tool = "" // which one would have been called is the question
	}
	why := repeatedMember(where) + ": JSON readers disagree on which one counts, so nothing was forwarded; send each member once"
	s.recordRefusedCall(id, tool, kind+": "+why+"; the agent was answered with a JSON-RPC error")
	return id, &jsonrpc.Error{Code: code, Message: "cmcp: " + why}, true
}

// notUTF8Why says why a tools/call whose text is not UTF-8 (rpcwire.NotUTF8:
// what, at where) is refused, naming the part of the call without quoting
// it. Such text must not reach an upstream: a server that writes it back
// as it came (Python's does) writes a line no strict reader takes, which
// would get a shared child stopped under every other agent's calls.
func notUTF8Why(where jsontext.Pointer, what string) string {
	part := "the tools/call message"
	switch w := string(where); {
	case w == "/params/arguments" || strings.HasPrefix(w, "/params/arguments/"):
		part = "arguments"
	case w == "/params/_meta" || strings.HasPrefix(w, "/params/_meta/"):
		part = "_meta"
	case w == "/params/name":
		part = "the tool name"
	}
	return fmt.Sprintf("%s: text that is not UTF-8, %s: the call is not valid JSON text in UTF-8 (RFC 8259 §8.1), which servers read differently, so nothing was forwarded; send text as UTF-8, each \\u surrogate escape with its pair", part, what)
}

// repeatedMember says which member of a tools/call message is repeated
// (where, a JSON Pointer) without quoting the payload: the message is the
// call record's reason, and a member name inside the arguments or _meta may
// be a secret (the arguments are only a commitment in the log). Only the
// protocol's own members are named.
func repeatedMember(where string) string {
	switch where {
	case "/id", "/method", "/jsonrpc", "/params", "/params/name", "/params/arguments", "/params/_meta":
		return fmt.Sprintf("the member %q appears twice in the tools/call message", jsontext.Pointer(where).LastToken())
	}
	if rest, ok := strings.CutPrefix(where, "/params/arguments/"); ok {
		return fmt.Sprintf("arguments: a member name is repeated (in an object at depth %d of the arguments)", strings.Count(rest, "/")+1)
	}
	return "a member name is repeated in the tools/call message"
}

// recordBadIDCall records a tools/call line refused for its id (see
// rpcwire.BadID) before anything decoded it.
func (s *session) recordBadIDCall(line []byte, why string) {
	var m struct {
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal(line, &m) != nil || m.Method != "tools/call" {
		return
	}
	s.recordRefusedCall(jsonrpc.ID{}, toolNameOf(m.Params), "invalid request: "+why+"; the agent was answered with a JSON-RPC error")
}

// toolNameOf is as much of a tools/call's tool name as can be read.
func toolNameOf(params json.RawMessage) string {
	var named struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(params, &named)
	return named.Name
}

// recordRefusedCall writes the call record of a tools/call refused before
// the pipeline saw it, with its JSON-RPC id when it has a valid one.
func (s *session) recordRefusedCall(id jsonrpc.ID, tool, reason string) {
	rec := &auditlog.Call{Session: s.id, Agent: s.principal, Tool: tool, Decision: auditlog.DecisionDeny,
		PolicyMode: ModeNone, Outcome: auditlog.OutcomeRefused, Reason: reason}
	if id.IsValid() {
		rec.RequestID, _ = json.Marshal(id.Raw())
	}
	s.g.record(s.ctx, rec)
	s.g.metricCall("", DecisionNone, OutcomeRefused, 0)
	s.callsChanged()
}

// sinkKey carries a fast HTTP call's response stream in the call's context,
// so that the messages an upstream sends while working on the call
// (progress, logging, sampling, elicitation, roots) reach the agent on that
// stream, as Streamable HTTP requires.
type sinkKey struct{}

func sinkFrom(ctx context.Context) *sseSink {
	if ctx == nil {
		return nil
	}
	sk, _ := ctx.Value(sinkKey{}).(*sseSink)
	return sk
}

// errStreamClosed: the call's response stream has ended; nothing more can
// be sent on it.
var errStreamClosed = errors.New("the call's response stream is closed")

// sseSink is the response stream of one fast HTTP call. It becomes an SSE
// stream when the first message related to the call has to go out before
// the response; a call without any answers with a plain application/json
// response (one write, no chunked encoding), as Streamable HTTP allows.
type sseSink struct {
	s  *session
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
	// sse: the headers went out as text/event-stream.
	sse bool
	// closed: the handler returned; later messages have nowhere to go.
	closed bool
}

// write sends one JSON-RPC message as an SSE event, starting the stream.
func (sk *sseSink) write(msg []byte) error {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.closed {
		return errStreamClosed
	}
	if !sk.sse {
		sk.sse = true
		h := sk.w.Header()
		h.Set("Cache-Control", "no-cache, no-transform")
		h.Set("Content-Type", "text/event-stream")
		h.Set("Connection", "keep-alive")
		sk.w.WriteHeader(http.StatusOK)
	}
	b := make([]byte, 0, len(msg)+24)
	b = append(b, "event: message\ndata: "...)
	b = append(b, msg...)
	b = append(b, "\n\n"...)
	if _, err := sk.w.Write(b); err != nil {
		return err
	}
	return sk.rc.Flush()
}

// respond sends the call's response: the last event of the SSE stream if
// one was started, else a JSON body. The stream is closed afterwards.
func (sk *sseSink) respond(msg []byte) error {
	sk.mu.Lock()
	if !sk.sse && !sk.closed {
		sk.closed = true
		sk.mu.Unlock()
		h := sk.w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(msg)))
		sk.w.WriteHeader(http.StatusOK)
		if _, err := sk.w.Write(msg); err != nil {
			return err
		}
		// On the wire before the handler returns: a shutdown closes the
		// connections once no request is in progress.
		return sk.rc.Flush()
	}
	sk.mu.Unlock()
	err := sk.write(msg)
	sk.close()
	return err
}

func (sk *sseSink) close() {
	sk.mu.Lock()
	sk.closed = true
	sk.mu.Unlock()
}

// notify sends a notification on the call's stream.
func (sk *sseSink) notify(method string, params any) error {
	b, err := encodeNotification(method, params)
	if err != nil {
		return err
	}
	return sk.write(b)
}

// encodeNotification is a JSON-RPC notification the gateway sends itself.
func encodeNotification(method string, params any) ([]byte, error) {
	return json.Marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}{"2.0", method, params})
}

// request sends a server-to-client request on the call's stream and waits
// for the agent's answer, which arrives as a POST of its own (httpFast).
func (sk *sseSink) request(ctx context.Context, method string, params any, result any) error {
	id, ch, err := sk.s.serverReqs.Register()
	if err != nil {
		return err
	}
	defer sk.s.serverReqs.Forget(id)
	b, err := json.Marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		ID      string `json:"id"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}{"2.0", id, method, params})
	if err != nil {
		return err
	}
	if err := sk.write(b); err != nil {
		return err
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			return sk.s.serverReqs.Err()
		}
		if resp.Error != nil {
			return resp.Error
		}
		if err := json.Unmarshal(resp.Result, result); err != nil {
			return fmt.Errorf("the agent's answer to %s is not valid: %w", method, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-sk.s.ctx.Done():
		return errors.New("the agent session ended")
	}
}

// serverReqPrefix starts the ids of the requests to the agent sent on
// fast-call streams (session.serverReqs).
const serverReqPrefix = "cmcp-s-"

// httpFast is the Streamable HTTP front's fast path for one POST of an
// initialised session: it answers a tools/call itself (an SSE stream with
// the call's related messages, then the response), takes the agent's
// answers to requests sent on such streams and its cancellations of fast
// calls. It reports whether it handled the request; if not, the request
// (body included) is unchanged for go-sdk, whose answers to anything
// unusual (bad headers, bad JSON, unknown sessions) are the reference.
func (s *session) httpFast(w http.ResponseWriter, r *http.Request, maxBytes int64) bool {
	if s.downSession() == nil || r.Header.Get("Last-Event-ID") != "" || baseMediaType(r.Header.Get("Content-Type")) != "application/json" {
		return false
	}
	if jsonOK, streamOK := streamableAccepts(r.Header.Values("Accept")); !jsonOK || !streamOK {
		return false
	}
	if v := r.Header.Get("Mcp-Protocol-Version"); v != "" && !slices.Contains(frontVersions(), v) {
		return false
	}
	// MCP's SEP request headers (Mcp-Method, Mcp-Name, Mcp-Param-*) are
	// checked by go-sdk only from protocol 2026-07-28, which the version
	// check above leaves to go-sdk: below it they mean nothing.
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBytes+1))
	rest := r.Body
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	if err != nil || int64(len(body)) > maxBytes {
		return false
	}
	msg, ok := rpcwire.DecodeFast(body)
	if !ok {
		if why := rpcwire.BadID(body); why != "" {
			s.recordBadIDCall(body, why)
			writeRPCError(w, http.StatusBadRequest, jsonrpc.ID{}, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "cmcp: " + why})
			return true
		}
		if m, err := rpcwire.DecodeMessage(body); err == nil {
			if req, ok := m.(*jsonrpc.Request); ok {
				if id, e, refused := s.refuseAmbiguousCall(req, body); refused {
					status := http.StatusOK
					if !id.IsValid() {
						status = http.StatusBadRequest
					}
					writeRPCError(w, status, id, e)
					return true
				}
				s.recordUndecodableCall(req)
			}
		}
		return false
	}
	switch m := msg.(type) {
	case *jsonrpc.Response:
		if !s.serverReqs.Deliver(m) {
			return false
		}
		w.WriteHeader(http.StatusAccepted)
		return true
	case *jsonrpc.Request:
		if m.Method == "notifications/cancelled" && !m.IsCall() && s.fast.cancel(m.Params) {
			w.WriteHeader(http.StatusAccepted)
			return true
		}
		if m.Method == "tools/call" && !m.IsCall() {
			if why := rpcwire.BadID(body); why != "" { // "id": null
				s.recordBadIDCall(body, why)
				writeRPCError(w, http.StatusBadRequest, jsonrpc.ID{}, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "cmcp: " + why})
				return true
			}
		}
		if m.Method != "tools/call" || !m.IsCall() {
			return false
		}
		call, ok := decodeFastCall(m.Params)
		call.ID = m.ID
		if !ok {
			s.recordUndecodableCall(m)
			return false
		}
		s.g.fastPath.Add(1)
		s.g.inflight.Add(1) // until the response is written (shutdown waits)
		defer s.g.inflight.Done()
		s.answering.Add(1) // the session's end too, for a call it cut
		defer s.answering.Done()
		ctx, cancel := context.WithCancel(s.ctx)
		defer cancel()
		if !s.fast.add(m.ID, cancel) {
			writeRPCError(w, http.StatusBadRequest, m.ID, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: fmt.Sprintf("duplicate in-flight request ID %v", m.ID.Raw())})
			return true
		}
		// Out of the in-flight table before the answer is written, not
		// when the handler returns: an agent that has read the answer may
		// send its next request with this id at once, on another
		// connection (TestReusedIDIsNotInFlight).
		done := sync.OnceFunc(func() { s.fast.remove(m.ID) })
		defer done()
		sk := &sseSink{s: s, w: w, rc: http.NewResponseController(w)}
		defer sk.close()
		var appendResult func(undelivered string)
		res, err := s.relay(context.WithValue(ctx, sinkKey{}, sk), call, &appendResult)
		done()
		if appendResult != nil {
			// After the response is written, and without holding up the
			// handler's return: the connection reads the agent's next
			// request only then, and in group durability the append
			// waits for the disk. The record says if the answer could
			// not be delivered (the agent did not read it).
			defer func() { why := undelivered(w); go appendResult(why) }()
		}
		if ctx.Err() != nil && sessionEndOf(ctx) == nil {
			// Cancelled by the agent: no JSON-RPC response, and the HTTP
			// response ends empty. A call its session's end cut is
			// answered below: err says why.
			sk.mu.Lock()
			if !sk.sse {
				w.WriteHeader(http.StatusAccepted)
			}
			sk.closed = true
			sk.mu.Unlock()
			return true
		}
		_ = sk.respond(encodeResponse(m.ID, res, err))
		return true
	}
	return false
}

func writeRPCError(w http.ResponseWriter, status int, id jsonrpc.ID, e *jsonrpc.Error) {
	b, _ := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: e})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

// streamableAccepts and baseMediaType are go-sdk's checks of a POST's
// Accept and Content-Type headers.
func streamableAccepts(values []string) (jsonOK, streamOK bool) {
	for _, value := range values {
		for _, raw := range strings.Split(value, ",") {
			base, _, _ := strings.Cut(strings.TrimSpace(raw), ";")
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "application/json", "application/*":
				jsonOK = true
			case "text/event-stream", "text/*":
				streamOK = true
			case "*/*":
				jsonOK, streamOK = true, true
			}
		}
	}
	return jsonOK, streamOK
}

func baseMediaType(value string) string {
	mt, _, err := mime.ParseMediaType(value)
	if err != nil {
		return ""
	}
	return mt
}

// forward sends an upstream's request to the agent on the call's stream
// and returns the agent's answer as the result type go-sdk expects.
func (sk *sseSink) forward(ctx context.Context, method string, params mcp.Params) (mcp.Result, error) {
	var res mcp.Result
	switch params.(type) {
	case *mcp.ElicitParams:
		res = &mcp.ElicitResult{}
	case *mcp.CreateMessageWithToolsParams:
		res = &mcp.CreateMessageWithToolsResult{}
	case *mcp.CreateMessageParams:
		res = &mcp.CreateMessageResult{}
	case *mcp.ListRootsParams:
		res = &mcp.ListRootsResult{}
	default:
		return nil, fmt.Errorf("cmcp cannot forward %s on a call's stream", method)
	}
	if err := sk.request(ctx, method, params, res); err != nil {
		return nil, err
	}
	return res, nil
}

// logLevels orders MCP logging levels (RFC 5424 severities).
var logLevels = map[mcp.LoggingLevel]int{"debug": 0, "info": 1, "notice": 2, "warning": 3, "error": 4, "critical": 5, "alert": 6, "emergency": 7}

// logs reports whether the agent asked for log messages at level, as
// go-sdk's ServerSession.Log decides: nothing until the agent sets a level.
func (s *session) logs(level mcp.LoggingLevel) bool {
	s.mu.Lock()
	min := s.logLevel
	s.mu.Unlock()
	if min == "" {
		return false
	}
	l, ok := logLevels[level]
	return !ok || l >= logLevels[min]
}

// stdioKey carries a fast stdio call's connection in the call's context, so
// that the gateway's own messages about the call (advise) reach the agent.
type stdioKey struct{}

// advise tells the agent, on the call's own stream, that the policy denies
// the call it is forwarding anyway (advisory mode; silent mode says
// nothing). It is an MCP logging message at level warning, sent unless the
// agent asked only for more severe ones.
func (s *session) advise(ctx context.Context, tool string, d Decision) {
	s.warnAgent(ctx, fmt.Sprintf("policy denies tool %q for %q; the call is forwarded because the policy is in advisory mode", tool, s.principal), d,
		map[string]any{"tool": tool})
}

// warnAgent sends the agent an advisory-mode warning on the request's own
// stream: msg, the decision's reason, and data's members.
func (s *session) warnAgent(ctx context.Context, msg string, d Decision, data map[string]any) {
	s.mu.Lock()
	level := s.logLevel
	s.mu.Unlock()
	if l, ok := logLevels[level]; ok && l > logLevels["warning"] {
		return
	}
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	data["message"], data["decision"], data["mode"], data["policy_ids"] = msg, d.Effect, d.Mode, d.PolicyIDs
	p := &mcp.LoggingMessageParams{Level: "warning", Logger: "cmcp.policy", Data: data}
	switch {
	case sinkFrom(ctx) != nil:
		_ = sinkFrom(ctx).notify("notifications/message", p)
	case ctx.Value(stdioKey{}) != nil:
		if b, err := encodeNotification("notifications/message", p); err == nil {
			_ = ctx.Value(stdioKey{}).(*stdiofront.Conn).WriteLine(b)
		}
	default:
		if ss := s.downSession(); ss != nil {
			_ = ss.Log(ctx, p) // go-sdk's path: only once the agent set a level
		}
	}
}
