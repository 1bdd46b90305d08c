package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The fast path: a front end that owns its wire (the stdio front, the
// Streamable HTTP front) answers tools/call itself, straight from the
// call pipeline, instead of through go-sdk's server session, which
// decodes, dispatches and re-encodes every message. Everything else an
// agent sends, and every call made before the session is initialised,
// still goes to go-sdk. Progress, logging, sampling and elicitation during
// a fast call reach the agent exactly as before (see live.route).

// fastParams are the parameters of a tools/call the fast path handles.
type fastParams struct {
	Meta      mcp.Meta        `json:"_meta"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// decodeFastCall decodes a tools/call's params, or reports false when
// go-sdk must answer the request (anything unusual: its errors are the
// reference).
func decodeFastCall(params json.RawMessage) (toolCall, bool) {
	var p fastParams
	if len(params) == 0 || params[0] != '{' || jsonv2.Unmarshal(params, &p) != nil {
		return toolCall{}, false
	}
	if len(p.Arguments) > 0 && p.Arguments[0] != '{' {
		return toolCall{}, false
	}
	return toolCall{Name: p.Name, Args: p.Arguments, Meta: p.Meta, Progress: p.Meta["progressToken"]}, true
}

// fastCalls are the fast path's in-flight calls of one connection, by
// request id, so that notifications/cancelled reaches them.
type fastCalls struct {
	mu sync.Mutex
	m  map[jsonrpc.ID]context.CancelFunc
}

func (f *fastCalls) add(id jsonrpc.ID, cancel context.CancelFunc) {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[jsonrpc.ID]context.CancelFunc{}
	}
	f.m[id] = cancel
	f.mu.Unlock()
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
// spliced in unchanged, or the error.
func encodeResponse(id jsonrpc.ID, result json.RawMessage, err error) ([]byte, error) {
	if err != nil {
		var we *jsonrpc.Error
		if !errors.As(err, &we) {
			we = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
		}
		return jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: we})
	}
	idb, e := json.Marshal(id.Raw())
	if e != nil {
		return nil, e
	}
	b := make([]byte, 0, len(result)+len(idb)+32)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, idb...)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	return append(b, '}'), nil
}

// stdioFast is the stdio front's fast path: it takes tools/call requests
// of an initialised session and the cancellations of those calls; it
// reports whether it took msg.
func (s *session) stdioFast(ctx context.Context, c *agentConn) func(*jsonrpc.Request) bool {
	var calls fastCalls
	return func(req *jsonrpc.Request) bool {
		switch req.Method {
		case "notifications/cancelled":
			return !req.IsCall() && calls.cancel(req.Params)
		case "tools/call":
		default:
			return false
		}
		if !req.IsCall() || s.downSession() == nil {
			return false
		}
		call, ok := decodeFastCall(req.Params)
		if !ok {
			return false
		}
		s.g.fastPath.Add(1)
		cctx, cancel := context.WithCancel(ctx)
		calls.add(req.ID, cancel)
		go func() {
			defer cancel()
			defer calls.remove(req.ID)
			res, err := s.relay(cctx, call)
			if cctx.Err() != nil {
				return // cancelled by the agent, or the connection ended: no response
			}
			b, err := encodeResponse(req.ID, res, err)
			if err != nil {
				s.g.logger.Error("encode a tools/call response", "err", err)
				return
			}
			_ = c.writeLine(b)
		}()
		return true
	}
}
