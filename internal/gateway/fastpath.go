package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	segjson "github.com/segmentio/encoding/json"

	"github.com/confidential-mcp/cmcp/internal/callwire"
	"github.com/confidential-mcp/cmcp/internal/front/httpfront"
	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
	"github.com/confidential-mcp/cmcp/internal/rpcwire"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

// The fast path: a front end that owns its wire (the stdio front, the
// Streamable HTTP front) answers tools/call itself, straight from the
// call pipeline, instead of through go-sdk's server session, which
// decodes, dispatches and re-encodes every message. Everything else an
// agent sends, and every call made before the session is initialised,
// still goes to go-sdk. Progress, logging, sampling and elicitation during
// a fast call reach the agent exactly as before (see live.route).

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
// of an initialised session, returning the call to run (a worker of the
// connection runs it while the agent's next messages are read), and the
// cancellations of those calls; it reports whether it took the request.
// The worker takes the call as far as its upstream (relayThen): a stdio
// child's read loop answers it once the child does, with no goroutine
// waiting for it meanwhile.
func (s *session) stdioFast(c *stdiofront.Conn) func(*jsonrpc.Request) (bool, func(over func())) {
	calls := &s.fast
	return func(req *jsonrpc.Request) (bool, func(over func())) {
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
		call, ok := callwire.Decode(req.Params)
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
		return true, func(over func()) {
			s.relayThen(context.WithValue(cctx, stdioKey{}, c), call, func(res json.RawMessage, err error, appendResult func(undelivered string)) {
				// Out of the in-flight table before the answer is written:
				// the agent may send its next request with this id as soon
				// as it reads the answer (TestReusedIDIsNotInFlight).
				calls.remove(req.ID)
				// Cancelled by the agent: no response. Cut by the session's
				// end: err says why, and the connection is still open.
				if cctx.Err() == nil || sessionEndOf(cctx) != nil {
					_ = c.WriteLine(encodeResponse(req.ID, res, err))
				}
				s.answering.Done()
				if appendResult != nil {
					appendResult("")
				}
				cancel()
				s.g.inflight.Done()
				over()
			})
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
	rec := &record.Call{Session: s.id, Agent: s.principal, Tool: tool, Decision: record.DecisionDeny,
		PolicyMode: ModeNone, Outcome: record.OutcomeRefused, Reason: reason}
	if id.IsValid() {
		rec.RequestID, _ = json.Marshal(id.Raw())
	}
	s.g.record(s.ctx, rec)
	s.g.metricCall("", DecisionNone, OutcomeRefused, 0)
	s.tools.CallsChanged()
}

// sinkKey carries a fast HTTP call's response stream in the call's context,
// so that the messages an upstream sends while working on the call
// (progress, logging, sampling, elicitation, roots) reach the agent on that
// stream, as Streamable HTTP requires.
type sinkKey struct{}

func sinkFrom(ctx context.Context) *httpfront.Stream {
	if ctx == nil {
		return nil
	}
	sk, _ := ctx.Value(sinkKey{}).(*httpfront.Stream)
	return sk
}

// serverReqPrefix starts the ids of the requests to the agent sent on
// fast-call streams (session.serverReqs).
const serverReqPrefix = "cmcp-s-"

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
		_ = sinkFrom(ctx).Notify("notifications/message", p)
	case ctx.Value(stdioKey{}) != nil:
		if b, err := rpcwire.EncodeNotification("notifications/message", p); err == nil {
			_ = ctx.Value(stdioKey{}).(*stdiofront.Conn).WriteLine(b)
		}
	default:
		if ss := s.downSession(); ss != nil {
			_ = ss.Log(ctx, p) // go-sdk's path: only once the agent set a level
		}
	}
}
