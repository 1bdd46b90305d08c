package gateway

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestOneLine: a result with line breaks (indented JSON from an HTTP
// upstream) is compacted, so that a stdio agent receives one line; any
// other result is passed through byte for byte.
func TestOneLine(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"content":[{"type":"text","text":"a\nb"}]}`, `{"content":[{"type":"text","text":"a\nb"}]}`},
		{`{ "content" : [ ] }`, `{ "content" : [ ] }`},
		{"{\n  \"content\": [\r\n    {\"type\": \"text\", \"text\": \"x y\"}\n  ]\n}", `{"content":[{"type":"text","text":"x y"}]}`},
		{"{\n not json", "{\n not json"},
	} {
		if got := string(oneLine(json.RawMessage(tc.in))); got != tc.want {
			t.Errorf("oneLine(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzFastCall feeds the fast path's decoding of tools/call params and its
// response encoding: it never panics; a call it takes has arguments that
// are absent or a JSON object, and the response it writes for any result
// the pipeline can return is one JSON-RPC response on one line.
func FuzzFastCall(f *testing.F) {
	for _, s := range []string{
		`{"name":"t__echo","arguments":{"text":"x"}}`,
		`{"_meta":{"progressToken":7},"name":"t__echo"}`,
		`{"name":"t__echo","arguments":[1]}`,
		`{"name":5}`, `[]`, `{`, `{"n\u0061me":"t__echo"}`, ` { "name" : "a" , "arguments" : { } } `, `{"name":"a\"b","arguments":{"x":"}"}}`, `{"name":"a","name":"b"}`, `{"arguments":{"a":{"b":[null,true,1.5e3]}}}`,
	} {
		f.Add([]byte(s), []byte(`{"content":[]}`))
	}
	f.Add([]byte(`{"name":"x"}`), []byte("{\n \"content\": [ ]\n}"))
	f.Add([]byte(`{}`), []byte(`{"isError":true,"content":[]}`))
	f.Add([]byte(`{}`), []byte(`{"isError":1}`))
	f.Add([]byte(`{}`), []byte(`{"\u0069sError":true}`))
	f.Add([]byte(`{}`), []byte(`{"isError":null,"isError":true}`))
	f.Fuzz(func(t *testing.T, params, result []byte) {
		// resultIsError reads isError as a full decode does.
		var shape struct {
			IsError bool `json:"isError"`
		}
		jerr := jsonv2.Unmarshal(result, &shape)
		if got, err := resultIsError(result); (err == nil) != (jerr == nil) || (err == nil && got != shape.IsError) {
			t.Fatalf("resultIsError(%q) = %v, %v; decoded %v, %v", result, got, err, shape.IsError, jerr)
		}
		if !jsontext.Value(params).IsValid() {
			return // decodeFastCall is given params of a strictly decoded message only
		}
		call, ok := decodeFastCall(params)
		if !ok {
			return
		}
		if len(call.Args) > 0 && (call.Args[0] != '{' || !json.Valid(call.Args)) {
			t.Fatalf("took arguments %q", call.Args)
		}
		// The scanner finds what a full decode finds.
		var p struct {
			Meta      mcp.Meta        `json:"_meta"`
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := jsonv2.Unmarshal(params, &p); err != nil {
			t.Fatalf("took %q, which does not decode: %v", params, err)
		}
		if p.Name != call.Name || !bytes.Equal(p.Arguments, call.Args) || !reflect.DeepEqual(p.Meta, call.Meta) || !reflect.DeepEqual(p.Meta["progressToken"], call.Progress) {
			t.Fatalf("%q: scanned %+v, decoded %+v", params, call, p)
		}
		if !json.Valid(result) {
			return // the pipeline refuses a result that is not JSON
		}
		id, _ := jsonrpc.MakeID("x")
		b := encodeResponse(id, oneLine(result), nil)
		if bytes.ContainsAny(b, "\r\n") || !json.Valid(b) {
			t.Fatalf("response %q is not one line of JSON", b)
		}
	})
}
