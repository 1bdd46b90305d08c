package rpcwire

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Real lines from a go-sdk client and the conformance everything-server,
// plus the corner cases that must go to go-sdk's decoder.
var vectors = []string{
	`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{},"clientInfo":{"name":"bench","version":"1"},"protocolVersion":"2025-06-18"}}`,
	`{"jsonrpc":"2.0","id":1,"result":{"capabilities":{"logging":{},"tools":{"listChanged":true}},"protocolVersion":"2025-06-18","serverInfo":{"name":"everything","version":"v1.0.0"}}}`,
	`{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`,
	`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"_meta":{"progressToken":"p-1"},"name":"test_simple_text","arguments":{"text":"héllo \u2028 \"q\""}}}`,
	`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"This is a simple text response for testing."}]}}`,
	`{"jsonrpc":"2.0","id":"s-9","error":{"code":-32602,"message":"unknown tool \"x\"","data":{"k": [1, 2.5e3]}}}`,
	`{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"method not found"}}`,
	`{"jsonrpc":"2.0","id":null,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":2.7,"method":"ping"}`,
	`{"jsonrpc":"2.0","id":-4,"result":{}}`,
	`{"jsonrpc":"2.0","id":1e3,"result":{ "a" : 1 }}`,
	`{"jsonrpc":"2.0","method":"","id":5}`,
	`{"jsonrpc":"2.0","method":null,"id":5}`,
	`{"jsonrpc":"2.0","id":5,"result":null}`,
	`{"jsonrpc":"2.0","id":5,"params":null,"method":"x"}`,
	`{"jsonrpc":"2.0","id":5,"error":null,"result":{}}`,
	`{"jsonrpc":"2.0","id":5,"error":{"code":1,"message":"m","data":null}}`,
	`{"jsonrpc":"2.0","id":5,"error":{"code":1.5,"message":"m"}}`,
	`{"jsonrpc":"2.0","id":5,"id":6,"result":{}}`,
	`{"jsonrpc":"2.0","ID":5,"result":{}}`,
	`{"jsonrpc":"2.0","Method":"x"}`,
	`{"jsonrpc":"1.0","id":5,"result":{}}`,
	`{"id":5,"result":{}}`,
	`{"jsonrpc":"2.0","result":{}}`,
	`{"jsonrpc":"2.0","id":true,"result":{}}`,
	`{"jsonrpc":"2.0","id":[1],"result":{}}`,
	`{"jsonrpc":"2.0","id":1e400,"result":{}}`,
	`{"jsonrpc":"2.0","id":"\xff","result":{}}`,
	`{"jsonrpc":"2.0","id":1,"result":{}} trailing`,
	` {"jsonrpc":"2.0","id":1,"result":{}}`,
	`{"jsonrpc":"2.0","id":1,"method":"x","params":` + strings.Repeat("[", 1001) + strings.Repeat("]", 1001) + `}`,
	`{"jsonrpc":"2.0","id":1,"method":"x","params":` + strings.Repeat("[", 999) + strings.Repeat("]", 999) + `}`,
	`[{"jsonrpc":"2.0","id":1,"result":{}}]`,
	`{"jsonrpc":"2.0","id":1,"result":{},}`,
	``,
}

// checkSame fails unless DecodeMessage(b) is exactly jsonrpc.DecodeMessage(b).
func checkSame(t *testing.T, b []byte) {
	t.Helper()
	want, wantErr := jsonrpc.DecodeMessage(b)
	got, gotErr := DecodeMessage(b)
	if _, ok := DecodeFast(b); ok && (!json.Valid(b) || b[0] != '{') {
		t.Fatalf("%q: decoded on the fast path but is not one JSON object", b)
	}
	if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && wantErr.Error() != gotErr.Error()) {
		t.Fatalf("%q: error %v, go-sdk says %v", b, gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\n got %#v\nwant %#v", b, got, want)
	}
}

func TestSameAsGoSDK(t *testing.T) {
	for _, v := range vectors {
		checkSame(t, []byte(v))
	}
}

// The messages of a tools/call round trip take the fast path (otherwise
// this package saves nothing).
func TestFastPathTaken(t *testing.T) {
	for _, v := range vectors[:7] {
		if _, ok := DecodeFast([]byte(v)); !ok {
			t.Errorf("%s: not decoded on the fast path", v)
		}
	}
}

// The decoded message owns its bytes: the caller may reuse the line.
func TestNoAliasing(t *testing.T) {
	b := []byte(vectors[3])
	m, err := DecodeMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	want := string(m.(*jsonrpc.Request).Params)
	for i := range b {
		b[i] = 'x'
	}
	if got := string(m.(*jsonrpc.Request).Params); got != want {
		t.Fatalf("params changed with the input line: %s", got)
	}
}

func FuzzDecodeMessage(f *testing.F) {
	for _, v := range vectors {
		f.Add([]byte(v))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkSame(t, b)
	})
}

func BenchmarkDecode(b *testing.B) {
	line := []byte(vectors[4])
	b.Run("rpcwire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeMessage(line); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("go-sdk", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := jsonrpc.DecodeMessage(line); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestIDsThatWouldBeReadAsOthers: DecodeFast takes only ids a float64
// holds exactly (strings, integers within ±2^53); BadID says why another
// is refused.
func TestIDsThatWouldBeReadAsOthers(t *testing.T) {
	for id, bad := range map[string]bool{
		`1`: false, `-7`: false, `"x"`: false, `9007199254740992`: false,
		`1.5`: true, `1e2`: true, `1.0`: true, `9007199254740993`: true, `123456789012345678901234567890`: true, `null`: true,
	} {
		line := []byte(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{}}`)
		why := BadID(line)
		if (why != "") != bad {
			t.Errorf("BadID(id %s) = %q", id, why)
		}
		if id == "null" {
			continue // a request without an id decodes (as go-sdk's notification)
		}
		if _, ok := DecodeFast(line); ok == bad {
			t.Errorf("DecodeFast(id %s) ok = %v", id, ok)
		}
	}
	if why := BadID([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); why != "" {
		t.Errorf("no id: %q", why)
	}
	// A response to the gateway's own request: its id is the gateway's.
	if why := BadID([]byte(`{"jsonrpc":"2.0","id":7.0,"result":{}}`)); why != "" {
		t.Errorf("a response: %q", why)
	}
}

// TestDuplicateName: a repeated member name is found, at the top level
// first (escaped spellings included), else at any depth, with its JSON
// Pointer; values without one, or invalid for another reason, report none.
func TestDuplicateName(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"params name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{},"name":"b"}}`, "/params/name"},
		{"in arguments", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"p":{"x":1,"x":2}}}}`, "/params/arguments/p/x"},
		{"top level first", `{"jsonrpc":"2.0","params":{"name":"a","name":"b"},"id":1,"method":"tools/call","id":2}`, "/id"},
		{"escaped top-level name", `{"jsonrpc":"2.0","id":1,"\u0069d":2,"method":"tools/call"}`, "/id"},
		{"slash in a name", `{"params":{"a/b":1,"a/b":2}}`, "/params/a~1b"},
		{"with invalid UTF-8", "{\"params\":{\"t\":\"\xff\",\"t\":1}}", "/params/t"},
		{"none", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"name":"a"}}}`, ""},
		{"same name in sibling objects", `{"a":{"x":1},"b":{"x":1},"c":[{"x":1},{"x":2}]}`, ""},
		{"not JSON", `{"a":1,"b"`, ""},
		{"not an object", `[{"a":1,"a":2}]`, "/0/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := DuplicateName([]byte(tc.in))
			if got != tc.want || ok != (tc.want != "") {
				t.Fatalf("DuplicateName(%s) = %q, %v; want %q", tc.in, got, ok, tc.want)
			}
		})
	}
}
