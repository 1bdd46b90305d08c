// Package rpcwire decodes JSON-RPC 2.0 messages for cmcp's own stdio
// transports (the stdio upstreams and `cmcp serve --stdio`) into go-sdk's
// jsonrpc types, without go-sdk's decoder. jsonrpc.DecodeMessage allocates
// a fresh 32 KiB read buffer for every message (its JSON decoder's minimum),
// which on the gateway's call path is the largest single source of garbage.
// DecodeMessage here gives exactly the message jsonrpc.DecodeMessage gives:
// it decodes the common, unambiguous shape itself and hands everything else
// (duplicate keys, null members, invalid UTF-8, odd id types, a wrong
// version tag, ...) to jsonrpc.DecodeMessage, so errors and corner cases
// are go-sdk's own. FuzzDecodeMessage checks the equivalence. Inbox is the
// read side both transports' connections share; Pending tracks the requests
// cmcp sends itself beside an SDK session on the same connection.
package rpcwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// maxDepth is go-sdk's nesting limit for decoded messages.
const maxDepth = 1000

type wireMsg struct {
	JSONRPC jsontext.Value `json:"jsonrpc"`
	ID      jsontext.Value `json:"id"`
	Method  jsontext.Value `json:"method"`
	Params  jsontext.Value `json:"params"`
	Result  jsontext.Value `json:"result"`
	Error   jsontext.Value `json:"error"`
}

type wireError struct {
	Code    int64          `json:"code"`
	Message string         `json:"message"`
	Data    jsontext.Value `json:"data"`
}

// DecodeMessage decodes one JSON-RPC message like jsonrpc.DecodeMessage.
func DecodeMessage(b []byte) (jsonrpc.Message, error) {
	if m, ok := DecodeFast(b); ok {
		return m, nil
	}
	return jsonrpc.DecodeMessage(b)
}

// DecodeFast decodes b when its meaning is unambiguous, giving what
// jsonrpc.DecodeMessage gives; ok is false when jsonrpc.DecodeMessage must
// decide. ok implies that b is exactly one valid JSON object.
func DecodeFast(b []byte) (msg jsonrpc.Message, ok bool) {
	if len(b) == 0 || b[0] != '{' {
		return nil, false
	}
	// Duplicate names and invalid UTF-8, at any depth, are not valid here
	// (go-sdk decides those); unknown members are ignored like go-sdk does.
	if !jsontext.Value(b).IsValid() {
		return nil, false
	}
	return DecodeChecked(bytes.Clone(b)) // the message owns its bytes: the caller may reuse b
}

// DecodeChecked is DecodeFast for a b already checked to be valid JSON in
// the strict sense (jsontext.Value(b).IsValid(): valid UTF-8, no duplicate
// names) that nobody changes later: the message keeps b's bytes. A tunnel
// frame's message is checked so once (wire.Frame.Checked), and decoding it
// does not check it a second time.
func DecodeChecked(b []byte) (msg jsonrpc.Message, ok bool) {
	if len(b) == 0 || b[0] != '{' || (len(b) > maxDepth && tooDeep(b)) { // deeper takes more bytes
		return nil, false
	}
	var w wireMsg
	if !EachMember(b, func(name, v []byte) {
		switch string(name) { // member names are case-sensitive
		case "jsonrpc":
			w.JSONRPC = v
		case "id":
			w.ID = v
		case "method":
			w.Method = v
		case "params":
			w.Params = v
		case "result":
			w.Result = v
		case "error":
			w.Error = v
		}
	}) {
		return nil, false
	}
	if string(w.JSONRPC) != `"2.0"` {
		return nil, false
	}
	var id jsonrpc.ID
	switch {
	case len(w.ID) == 0 || string(w.ID) == "null":
	case w.ID[0] == '"':
		s, plain := plainString(w.ID)
		if !plain && jsonv2.Unmarshal(w.ID, &s) != nil {
			return nil, false
		}
		id, _ = jsonrpc.MakeID(s)
	case w.ID[0] == '-' || (w.ID[0] >= '0' && w.ID[0] <= '9'):
		// An integer that a float64 holds exactly: 1.5, 1e3 and 2^53+1
		// would be read as another id (go-sdk truncates), so two calls
		// could share one and an answer reach the wrong caller. BadID
		// says why such a line is refused.
		n, err := strconv.ParseInt(string(w.ID), 10, 64)
		if err != nil || n > maxExactID || n < -maxExactID {
			return nil, false
		}
		id, _ = jsonrpc.MakeID(float64(n))
	default:
		return nil, false
	}
	if isNull(w.Params) || isNull(w.Result) || isNull(w.Error) || isNull(w.Method) {
		return nil, false
	}
	if len(w.Method) > 0 {
		method, plain := plainString(w.Method)
		if !plain && (w.Method[0] != '"' || jsonv2.Unmarshal(w.Method, &method) != nil) {
			return nil, false
		}
		return &jsonrpc.Request{Method: method, ID: id, Params: raw(w.Params)}, true
	}
	if !id.IsValid() {
		return nil, false
	}
	resp := &jsonrpc.Response{ID: id, Result: raw(w.Result)}
	if len(w.Error) > 0 {
		var we wireError
		if w.Error[0] != '{' || jsonv2.Unmarshal(w.Error, &we) != nil || isNull(we.Data) {
			return nil, false
		}
		resp.Error = &jsonrpc.Error{Code: we.Code, Message: we.Message, Data: raw(we.Data)}
	}
	return resp, true
}

func isNull(v jsontext.Value) bool { return string(v) == "null" }

func raw(v jsontext.Value) json.RawMessage {
	if len(v) == 0 {
		return nil
	}
	return json.RawMessage(v)
}

// tooDeep reports nesting beyond maxDepth (go-sdk refuses those).
func tooDeep(b []byte) bool {
	depth, inString, escaped := 0, false, false
	for _, c := range b {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > maxDepth {
				return true
			}
		case '}', ']':
			if depth > 0 {
				depth--
			}
		}
	}
	return false
}

// maxExactID is the largest integer a float64 (JSON-RPC ids in go-sdk)
// holds exactly.
const maxExactID = 1 << 53

// BadID returns why the "id" member of the request b (a JSON object with a
// "method") is not an id MCP allows (a string, or an integer within ±2^53),
// or "" if it is one, there is none, or b is not a request. A null id is
// refused too: MCP requests never have one. A response's id is the one the
// gateway chose, so whatever its spelling (7.0) it is not refused here.
func BadID(b []byte) string {
	var id []byte
	method := false
	if !EachMember(b, func(n, v []byte) {
		switch string(n) {
		case "id":
			id = v
		case "method":
			method = true
		}
	}) || id == nil || !method {
		return ""
	}
	switch {
	case string(id) == "null":
		return "the id is null: MCP requests have a string or integer id"
	case id[0] == '"':
		return ""
	case id[0] == '-' || (id[0] >= '0' && id[0] <= '9'):
		if n, err := strconv.ParseInt(string(id), 10, 64); err != nil || n > maxExactID || n < -maxExactID {
			return fmt.Sprintf("the id %.40s is not an integer within ±2^53: MCP ids are strings or integers, and this one would be read as another", id)
		}
		return ""
	}
	return "the id must be a string or an integer"
}

// DuplicateName returns the JSON Pointer (RFC 6901) of a member of the JSON
// value b whose name repeats an earlier one in the same object, and whether
// there is one: a duplicate among b's own members first (names compared
// unescaped), else the first one at any depth. Readers disagree on such a
// value (the first member wins in one, the last in another), so what one
// part of the gateway reads another may not. A value that turns invalid
// (invalid UTF-8 aside) before a duplicate reports none.
func DuplicateName(b []byte) (string, bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(b), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	if tok, err := dec.ReadToken(); err == nil && tok.Kind() == '{' {
		seen := map[string]bool{}
		for dec.PeekKind() == '"' {
			tok, err := dec.ReadToken()
			if err != nil {
				break
			}
			name := tok.String()
			if seen[name] {
				return string(jsontext.Pointer("").AppendToken(name)), true
			}
			seen[name] = true
			if dec.SkipValue() != nil {
				break
			}
		}
	}
	dec = jsontext.NewDecoder(bytes.NewReader(b), jsontext.AllowInvalidUTF8(true))
	var se *jsontext.SyntacticError
	if err := dec.SkipValue(); errors.As(err, &se) && errors.Is(se.Err, jsontext.ErrDuplicateName) {
		return string(se.JSONPointer), true
	}
	return "", false
}

// NotUTF8 reports whether the JSON value b is valid JSON but for its text,
// which is not UTF-8 (RFC 8259 §8.1): bytes that are not UTF-8, or a
// \uXXXX escape of half a surrogate pair without the other half, which no
// UTF-8 text can hold. where is the JSON Pointer (RFC 6901) of the value
// holding the first such string (in b's own members, a name may be bad
// too), and what says which of the two it is. Readers differ on such text:
// go-sdk's replaces it with U+FFFD, Python's keeps it and writes it back
// out as it came, which a strict reader (this package's) refuses.
func NotUTF8(b []byte) (where jsontext.Pointer, what string, bad bool) {
	if jsontext.Value(b).IsValid(jsontext.AllowDuplicateNames(true)) ||
		!jsontext.Value(b).IsValid(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)) {
		return "", "", false
	}
	what = "a lone surrogate escape (half a UTF-16 pair, \\uD800 to \\uDFFF, without its other half)"
	if !utf8.Valid(b) {
		what = "bytes that are not UTF-8"
	}
	dec := jsontext.NewDecoder(bytes.NewReader(b), jsontext.AllowDuplicateNames(true))
	var se *jsontext.SyntacticError
	if err := dec.SkipValue(); errors.As(err, &se) {
		where = se.JSONPointer
	}
	return where, what, true
}

// MayBeNotUTF8 is a quick test for NotUTF8: false means b's text is
// certainly UTF-8 (b may still be invalid JSON otherwise).
func MayBeNotUTF8(b []byte) bool {
	return !utf8.Valid(b) || bytes.Contains(b, []byte(`\ud`)) || bytes.Contains(b, []byte(`\uD`))
}

// EncodeNotification is a JSON-RPC notification the gateway sends itself.
func EncodeNotification(method string, params any) ([]byte, error) {
	return json.Marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}{"2.0", method, params})
}
