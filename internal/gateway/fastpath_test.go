package gateway

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
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
		`{"name":5}`, `[]`, `{`, `{"name":"a","name":"b"}`, `{"arguments":{"a":{"b":[null,true,1.5e3]}}}`,
	} {
		f.Add([]byte(s), []byte(`{"content":[]}`))
	}
	f.Add([]byte(`{"name":"x"}`), []byte("{\n \"content\": [ ]\n}"))
	f.Fuzz(func(t *testing.T, params, result []byte) {
		call, ok := decodeFastCall(params)
		if !ok {
			return
		}
		if len(call.Args) > 0 && (call.Args[0] != '{' || !json.Valid(call.Args)) {
			t.Fatalf("took arguments %q", call.Args)
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
