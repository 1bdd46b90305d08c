package httpfront

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

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

// fast is the fast path for one POST of an initialised session: the core
// answers a tools/call itself (Session.Call: an SSE stream with the call's
// related messages, then the response), and the front takes the agent's
// answers to requests sent on such streams and its cancellations of fast
// calls. It reports whether it handled the request; if not, the request
// (body included) is unchanged for go-sdk, whose answers to anything
// unusual (bad headers, bad JSON, unknown sessions) are the reference.
func (f *front) fast(s Session, w http.ResponseWriter, r *http.Request) bool {
	if !s.Initialized() || r.Header.Get("Last-Event-ID") != "" || baseMediaType(r.Header.Get("Content-Type")) != "application/json" {
		return false
	}
	if jsonOK, streamOK := streamableAccepts(r.Header.Values("Accept")); !jsonOK || !streamOK {
		return false
	}
	if v := r.Header.Get("Mcp-Protocol-Version"); v != "" && !slices.Contains(f.core.ProtocolVersions(), v) {
		return false
	}
	// MCP's SEP request headers (Mcp-Method, Mcp-Name, Mcp-Param-*) are
	// checked by go-sdk only from protocol 2026-07-28, which the version
	// check above leaves to go-sdk: below it they mean nothing.
	body, err := io.ReadAll(io.LimitReader(r.Body, f.maxBytes+1))
	rest := r.Body
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	if err != nil || int64(len(body)) > f.maxBytes {
		return false
	}
	msg, ok := rpcwire.DecodeFast(body)
	if !ok {
		return refuseUndecodable(s, w, body)
	}
	switch m := msg.(type) {
	case *jsonrpc.Response:
		if !s.Pending().Deliver(m) {
			return false
		}
		w.WriteHeader(http.StatusAccepted)
		return true
	case *jsonrpc.Request:
		if m.Method == "notifications/cancelled" && !m.IsCall() && s.CancelCall(m.Params) {
			w.WriteHeader(http.StatusAccepted)
			return true
		}
		if m.Method == "tools/call" && !m.IsCall() {
			if why := rpcwire.BadID(body); why != "" { // "id": null
				s.BadID(body, why)
				writeRPCError(w, http.StatusBadRequest, jsonrpc.ID{}, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "cmcp: " + why})
				return true
			}
		}
		if m.Method != "tools/call" || !m.IsCall() {
			return false
		}
		return s.Call(m, &Stream{pending: s.Pending(), done: s.Context().Done(), w: w, rc: http.NewResponseController(w)})
	}
	return false
}

// refuseUndecodable answers a POST whose body the fast decoder did not
// take, if it has a bad id or is an ambiguous request; it reports whether
// it did (else go-sdk answers it).
func refuseUndecodable(s Session, w http.ResponseWriter, body []byte) bool {
	if why := rpcwire.BadID(body); why != "" {
		s.BadID(body, why)
		writeRPCError(w, http.StatusBadRequest, jsonrpc.ID{}, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "cmcp: " + why})
		return true
	}
	if m, err := rpcwire.DecodeMessage(body); err == nil {
		if req, ok := m.(*jsonrpc.Request); ok {
			if id, e, refused := s.Ambiguous(req, body); refused {
				status := http.StatusOK
				if !id.IsValid() {
					status = http.StatusBadRequest
				}
				writeRPCError(w, status, id, e)
				return true
			}
			s.Passed(req)
		}
	}
	return false
}

// ErrStreamClosed: the call's response stream has ended; nothing more can
// be sent on it.
var ErrStreamClosed = errors.New("the call's response stream is closed")

// Stream is the response stream of one fast HTTP call. It becomes an SSE
// stream when the first message related to the call has to go out before
// the response; a call without any answers with a plain application/json
// response (one write, no chunked encoding), as Streamable HTTP allows.
type Stream struct {
	pending *rpcwire.Pending
	done    <-chan struct{} // the session's end
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	// sse: the headers went out as text/event-stream.
	sse bool
	// closed: the handler returned; later messages have nowhere to go.
	closed bool
}

// write sends one JSON-RPC message as an SSE event, starting the stream.
func (sk *Stream) write(msg []byte) error {
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.closed {
		return ErrStreamClosed
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

// Respond sends the call's response: the last event of the SSE stream if
// one was started, else a JSON body. The stream is closed afterwards.
func (sk *Stream) Respond(msg []byte) error {
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
	sk.Close()
	return err
}

// Cancelled ends the stream of a call the agent cancelled: no JSON-RPC
// response, and the HTTP response ends empty.
func (sk *Stream) Cancelled() {
	sk.mu.Lock()
	if !sk.sse {
		sk.w.WriteHeader(http.StatusAccepted)
	}
	sk.closed = true
	sk.mu.Unlock()
}

// Refuse answers the call, before anything was sent on the stream, with
// the JSON-RPC error e and HTTP status.
func (sk *Stream) Refuse(status int, id jsonrpc.ID, e *jsonrpc.Error) {
	writeRPCError(sk.w, status, id, e)
}

// Close ends the stream: later messages have nowhere to go.
func (sk *Stream) Close() {
	sk.mu.Lock()
	sk.closed = true
	sk.mu.Unlock()
}

// Undelivered is why the stream could not deliver what was written to it,
// or "" (every write succeeded).
func (sk *Stream) Undelivered() string {
	if sw, ok := sk.w.(*stallWriter); ok {
		return sw.failed
	}
	return ""
}

// Notify sends a notification on the call's stream.
func (sk *Stream) Notify(method string, params any) error {
	b, err := rpcwire.EncodeNotification(method, params)
	if err != nil {
		return err
	}
	return sk.write(b)
}

// request sends a server-to-client request on the call's stream and waits
// for the agent's answer, which arrives as a POST of its own (fast).
func (sk *Stream) request(ctx context.Context, method string, params any, result any) error {
	id, ch, err := sk.pending.Register()
	if err != nil {
		return err
	}
	defer sk.pending.Forget(id)
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
			return sk.pending.Err()
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
	case <-sk.done:
		return errors.New("the agent session ended")
	}
}

// Forward sends an upstream's request to the agent on the call's stream
// and returns the agent's answer as the result type go-sdk expects. It
// fails with ErrStreamClosed, having sent nothing, once the stream ended.
func (sk *Stream) Forward(ctx context.Context, method string, params mcp.Params) (mcp.Result, error) {
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
