// Package callwire reads and writes a tools/call as bytes, for the call
// pipeline's fast paths: its params decoded without a full parse (Decode),
// the _meta sent upstream with only the progress token replaced (SpliceMeta),
// a result's isError read (ResultIsError), a result put on one line for a
// stdio agent (OneLine). The agent's bytes reach the upstream, and the
// upstream's the agent, unchanged wherever MCP lets them be.
package callwire

import (
	"bytes"
	"encoding/json"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/rpcwire"
)

// A Call is one tools/call as the agent sent it.
type Call struct {
	Name     string
	Args     json.RawMessage // the arguments object exactly as sent (empty: none)
	Meta     json.RawMessage // the agent's _meta object exactly as sent (empty: none), forwarded
	Progress any             // the agent's progress token (on the fast paths its exact bytes, a json.RawMessage), or nil
	ID       jsonrpc.ID      // the JSON-RPC id, when the front read it (the fast paths)
}

// Decode decodes a tools/call's params, or reports false when
// go-sdk must answer the request (anything unusual: its errors are the
// reference). params must be valid JSON in the strict sense (RFC 7493),
// as in a message rpcwire.DecodeFast took, which both fronts make sure
// of: its members are found without validating or decoding it again
// (rpcwire.EachMember).
func Decode(params json.RawMessage) (Call, bool) {
	if len(params) == 0 || params[0] != '{' {
		return Call{}, false
	}
	var call Call
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
		return Call{}, false
	}
	if len(name) == 0 || name[0] != '"' || jsonv2.Unmarshal(name, &call.Name) != nil {
		return Call{}, false
	}
	if len(call.Args) > 0 && call.Args[0] != '{' {
		return Call{}, false
	}
	// _meta stays the bytes the agent sent (numbers beyond float64, member
	// order, "<>&" unescaped): the upstream gets them as they are, with
	// only the progress token replaced by the gateway's (SpliceMeta), and
	// the agent gets its own token back, as it spelled it, on progress.
	switch {
	case len(meta) == 0 || string(meta) == "null":
	case meta[0] != '{':
		return Call{}, false
	default:
		var tok []byte
		if !rpcwire.EachMember(meta, func(n, v []byte) {
			if string(n) == "progressToken" {
				tok = v
			}
		}) {
			return Call{}, false // a member name with an escape (it may spell progressToken): go-sdk decodes it
		}
		call.Meta = meta
		if len(tok) > 0 && string(tok) != "null" {
			call.Progress = json.RawMessage(tok)
		}
	}
	return call, true
}

// SpliceMeta is the _meta to send upstream: the agent's bytes (an object,
// or empty for none) with the value of progressToken replaced by the
// gateway's own token upTok (nil: none; the agent sent none either), added
// if the agent's _meta has none. Every other byte is the agent's.
func SpliceMeta(meta json.RawMessage, upTok any) json.RawMessage {
	if upTok == nil {
		return meta
	}
	tok, err := json.Marshal(upTok)
	if err != nil {
		return meta
	}
	if len(meta) == 0 || meta[0] != '{' {
		return append(append([]byte(`{"progressToken":`), tok...), '}')
	}
	start, end := -1, -1
	if !rpcwire.EachMember(meta, func(n, v []byte) {
		if string(n) == "progressToken" {
			// v is meta[start:end], a slice of meta's own array.
			start = cap(meta) - cap(v)
			end = start + len(v)
		}
	}) {
		// A member name with an escape (only from go-sdk's encoding, the
		// fast paths leave such calls to go-sdk): decoded and encoded.
		var m map[string]jsontext.Value
		if jsonv2.Unmarshal(meta, &m) != nil {
			return meta
		}
		m["progressToken"] = tok
		if b, err := jsonv2.Marshal(m, jsonv2.Deterministic(true)); err == nil {
			return b
		}
		return meta
	}
	out := make([]byte, 0, len(meta)+len(tok)+20)
	if start >= 0 {
		out = append(out, meta[:start]...)
		out = append(out, tok...)
		return append(out, meta[end:]...)
	}
	// First, so that an empty object needs no comma.
	out = append(append(out, `{"progressToken":`...), tok...)
	if rest := bytes.TrimLeft(meta[1:], " \t\r\n"); len(rest) == 0 || rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, meta[1:]...)
}

// OneLine returns a result as the upstream sent it unless it holds line
// breaks (an HTTP upstream may send indented JSON), which a line-framed
// stdio agent cannot receive: then without its insignificant white space.
// Invalid JSON is returned unchanged (the caller refuses it).
func OneLine(res json.RawMessage) json.RawMessage {
	if !bytes.ContainsAny(res, "\r\n") {
		return res
	}
	var b bytes.Buffer
	if json.Compact(&b, res) != nil {
		return res
	}
	return b.Bytes()
}

// ResultIsError reads a tools/call result's isError, or fails if the
// result is not a JSON object whose isError (if any) is a boolean or null.
func ResultIsError(res json.RawMessage) (bool, error) {
	if len(res) > 0 && res[0] == '{' && jsontext.Value(res).IsValid() {
		if isError, ok := CheckedIsError(res); ok {
			return isError, nil
		}
	}
	// Anything else is decoded in full, for its error.
	var shape struct {
		IsError bool `json:"isError"`
	}
	err := jsonv2.Unmarshal(res, &shape)
	return shape.IsError, err
}

// CheckedIsError is ResultIsError for a result known to be valid JSON in
// the strict sense (RFC 7493: valid UTF-8, no repeated member names, so
// isError is read one way by every reader): ok is false when it must be
// decoded in full (not an object, a member name with an escape, an isError
// that is not a boolean or null).
func CheckedIsError(res json.RawMessage) (isError, ok bool) {
	if len(res) == 0 || res[0] != '{' {
		return false, false
	}
	var v []byte
	if !rpcwire.EachMember(res, func(name, value []byte) {
		if string(name) == "isError" {
			v = value
		}
	}) {
		return false, false
	}
	switch string(v) {
	case "true":
		return true, true
	case "", "false", "null":
		return false, true
	}
	return false, false
}

// Kind names the kind of a JSON value by its first byte, for an error
// message that must not repeat the value (arguments reach the log only as
// commitments).
func Kind(v []byte) string {
	switch {
	case len(v) == 0:
		return "nothing"
	case v[0] == '[':
		return "an array"
	case v[0] == '"':
		return "a string"
	case v[0] == 't' || v[0] == 'f':
		return "a boolean"
	default:
		return "a number"
	}
}
