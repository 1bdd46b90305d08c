package stdiofront

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// FuzzAgentLine feeds the stdio front end's line decoder: it never panics, a
// line is either one JSON-RPC message or a parse/invalid-request error, and
// readLine never returns more than its maximum.
func FuzzAgentLine(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"result":{}}`,
		`{"jsonrpc":"2.0","id":"a","error":{"code":-1,"message":"m"}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`,
		`"str"`, `42`, `null`, `{`, `{"jsonrpc":"1.0","id":1,"method":"x"}`, `{"id":7,"method":5}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		trimmed := bytes.TrimSpace(b)
		if len(trimmed) > 0 {
			msg, _, code, why := DecodeLine(trimmed)
			if msg == nil && (why == "" || (code != jsonrpc.CodeParseError && code != jsonrpc.CodeInvalidRequest)) {
				t.Fatalf("%q: no message and code %d %q", b, code, why)
			}
		}
		br := bufio.NewReaderSize(bytes.NewReader(b), 16)
		for {
			line, tooLong, err := readLine(br, 64)
			if err != nil {
				break
			}
			if len(line) > 64 || (tooLong && len(b) <= 64) {
				t.Fatalf("readLine: %d bytes, tooLong=%v", len(line), tooLong)
			}
		}
	})
}
