package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/callwire"
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
		if got := string(callwire.OneLine(json.RawMessage(tc.in))); got != tc.want {
			t.Errorf("callwire.OneLine(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestSpliceMeta: the _meta sent upstream is the agent's, byte for byte,
// with only the progress token's value replaced by the gateway's (added
// if the agent's _meta has none).
func TestSpliceMeta(t *testing.T) {
	for _, tc := range []struct {
		name, meta string
		tok        any
		want       string
	}{
		{"no token", `{"a":12345678901234567890, "b":"<&>"}`, nil, `{"a":12345678901234567890, "b":"<&>"}`},
		{"no _meta", ``, nil, ``},
		{"replaced in place", `{"z":1,"progressToken":9007199254740993 ,"a":[1.0]}`, "cmcp-2", `{"z":1,"progressToken":"cmcp-2" ,"a":[1.0]}`},
		{"added to an empty object", `{ }`, "cmcp-3", `{"progressToken":"cmcp-3" }`},
		{"added first", `{"a":1e400}`, "cmcp-4", `{"progressToken":"cmcp-4","a":1e400}`},
		{"created", ``, "cmcp-5", `{"progressToken":"cmcp-5"}`},
		{"escaped names (go-sdk's encoding)", `{"\u003c":1,"progressToken":2}`, "cmcp-6", `{"<":1,"progressToken":"cmcp-6"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(callwire.SpliceMeta(json.RawMessage(tc.meta), tc.tok)); got != tc.want {
				t.Errorf("callwire.SpliceMeta(%s, %v) = %s, want %s", tc.meta, tc.tok, got, tc.want)
			}
		})
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
		`{"_meta":{"a":1e400,"progressToken":9007199254740993,"b":"<&>"},"name":"t__echo"}`, `{"_meta":null,"name":"x"}`, `{"_meta":{"progressToken":null},"name":"x"}`,
		`{"_meta":{"progress\u0054oken":"t"},"name":"x"}`, `{"_meta":[],"name":"x"}`,
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
		if got, err := callwire.ResultIsError(result); (err == nil) != (jerr == nil) || (err == nil && got != shape.IsError) {
			t.Fatalf("callwire.ResultIsError(%q) = %v, %v; decoded %v, %v", result, got, err, shape.IsError, jerr)
		}
		if !jsontext.Value(params).IsValid() {
			return // decodeFastCall is given params of a strictly decoded message only
		}
		call, ok := callwire.Decode(params)
		if !ok {
			return
		}
		if len(call.Args) > 0 && (call.Args[0] != '{' || !json.Valid(call.Args)) {
			t.Fatalf("took arguments %q", call.Args)
		}
		// The scanner finds what a full decode finds; _meta and the
		// progress token are their bytes as sent.
		var p struct {
			Meta      jsontext.Value  `json:"_meta"`
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := jsonv2.Unmarshal(params, &p); err != nil {
			t.Fatalf("took %q, which does not decode: %v", params, err)
		}
		var meta map[string]jsontext.Value
		if err := jsonv2.Unmarshal(p.Meta, &meta); len(p.Meta) > 0 && err != nil {
			t.Fatalf("took %q, whose _meta is not an object: %v", params, err)
		}
		if string(p.Meta) == "null" {
			p.Meta = nil
		}
		var tok any
		if v := meta["progressToken"]; len(v) > 0 && string(v) != "null" {
			tok = json.RawMessage(v)
		}
		if p.Name != call.Name || !bytes.Equal(p.Arguments, call.Args) || !bytes.Equal(p.Meta, call.Meta) || !reflect.DeepEqual(tok, call.Progress) {
			t.Fatalf("%q: scanned %+v, decoded %+v", params, call, p)
		}
		// Upstream, the token is the gateway's and nothing else changes.
		if call.Progress != nil {
			var spliced map[string]jsontext.Value
			if err := jsonv2.Unmarshal(callwire.SpliceMeta(call.Meta, "cmcp-1"), &spliced); err != nil || string(spliced["progressToken"]) != `"cmcp-1"` || len(spliced) != len(meta) {
				t.Fatalf("%q: spliced _meta %s (%v)", params, callwire.SpliceMeta(call.Meta, "cmcp-1"), err)
			}
			for k, v := range meta {
				if k != "progressToken" && !bytes.Equal(spliced[k], v) {
					t.Fatalf("%q: spliced _meta changed %q: %s", params, k, spliced[k])
				}
			}
		}
		if !json.Valid(result) {
			return // the pipeline refuses a result that is not JSON
		}
		id, _ := jsonrpc.MakeID("x")
		b := encodeResponse(id, callwire.OneLine(result), nil)
		if bytes.ContainsAny(b, "\r\n") || !json.Valid(b) {
			t.Fatalf("response %q is not one line of JSON", b)
		}
	})
}

// BenchmarkFastCallMeta is the fast path's work on a tools/call's params
// with a _meta and a progress token: decoding them, and the _meta sent
// upstream.
func BenchmarkFastCallMeta(b *testing.B) {
	params := json.RawMessage(`{"_meta":{"progressToken":42,"trace":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","n":12345678901234567890},"name":"t__echo","arguments":{"text":"bench"}}`)
	b.ReportAllocs()
	for b.Loop() {
		call, ok := callwire.Decode(params)
		if !ok || len(callwire.SpliceMeta(call.Meta, "cmcp-1")) == 0 {
			b.Fatal("not taken")
		}
	}
}

// BenchmarkResultIsError reads a tools/call result's isError as the call
// pipeline does: resultIsError checks the result's JSON first, which a
// result from a line the strict decoder took (upstream.WithChecked) skips
// (checkedIsError).
func BenchmarkResultIsError(b *testing.B) {
	for _, n := range []int{5, 64 << 10} {
		res := json.RawMessage(`{"content":[{"type":"text","text":"` + strings.Repeat("x", n) + `"}],"isError":false}`)
		b.Run(fmt.Sprintf("checked again/%dB", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := callwire.ResultIsError(res); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("checked on arrival/%dB", n), func(b *testing.B) {
			for b.Loop() {
				if _, ok := callwire.CheckedIsError(res); !ok {
					b.Fatal("not read")
				}
			}
		})
	}
}
