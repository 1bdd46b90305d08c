package framing

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// Real messages of an MCP session (go-sdk client talking to a stdio server).
var realMessages = []string{
	`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"roots":{"listChanged":true}},"clientInfo":{"name":"cmcp","version":"devel"}}}`,
	`{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"sample","version":"1.0.0"}}}`,
	`{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`,
	`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`,
	`{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"echo","description":"Echo the text back","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]}}`,
	`{"jsonrpc":"2.0","id":"c-3","method":"tools/call","params":{"name":"echo","arguments":{"text":"héllo\nworld \u2028"},"_meta":{"progressToken":7}}}`,
	`{"jsonrpc":"2.0","id":"c-3","result":{"content":[{"type":"text","text":"héllo\nworld"}],"isError":false}}`,
	`{"jsonrpc":"2.0","id":4,"error":{"code":-32601,"message":"Method not found"}}`,
	`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"c-3","reason":"timeout"}}`,
	`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`,
}

func TestReadRealSession(t *testing.T) {
	stream := strings.Join(realMessages, "\n") + "\n"
	r := NewReader(strings.NewReader(stream), 0)
	for i, want := range realMessages {
		got, err := r.Read()
		if err != nil || string(got) != want {
			t.Fatalf("message %d: %s, %v", i, got, err)
		}
	}
	if _, err := r.Read(); err != io.EOF {
		t.Fatalf("at the end: %v, want io.EOF", err)
	}
	if r.Offset() != int64(len(stream)) {
		t.Fatalf("Offset = %d, want %d", r.Offset(), len(stream))
	}
}

func TestReadDesync(t *testing.T) {
	ok := realMessages[3] + "\n"
	tests := []struct {
		name, line, reason string
		err                error
	}{
		{"log line on stdout", "Server started on stdio\n", "not JSON", nil},
		{"empty line", "\n", "empty line", nil},
		{"batch", `[` + realMessages[3] + `]` + "\n", "batch", nil},
		{"string", `"hello"` + "\n", "a JSON string", nil},
		{"two objects", realMessages[3] + realMessages[3] + "\n", "more than one JSON value", nil},
		{"no jsonrpc", `{"id":1,"method":"x"}` + "\n", `no "jsonrpc"`, nil},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":1,"method":"x"}` + "\n", `not "2.0"`, nil},
		{"escaped name still checked", `{"json\u0072pc":"1.0","id":1,"method":"x"}` + "\n", `not "2.0"`, nil},
		{"duplicate member", `{"jsonrpc":"2.0","id":1,"id":2,"result":{}}` + "\n", "duplicate", nil},
		{"method not string", `{"jsonrpc":"2.0","id":1,"method":3}` + "\n", `"method" is not a string`, nil},
		{"response without result or error", `{"jsonrpc":"2.0","id":1}` + "\n", "exactly one", nil},
		{"response with both", `{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1}}` + "\n", "exactly one", nil},
		{"id object", `{"jsonrpc":"2.0","id":{},"result":1}` + "\n", `"id" is not`, nil},
		{"truncated object", `{"jsonrpc":"2.0","id":1,"res` + "\n", "invalid JSON", nil},
		{"invalid utf-8", "{\"jsonrpc\":\"2.0\",\"method\":\"\xff\"}\n", "invalid UTF-8", nil},
		{"no final newline", realMessages[3], "ended in the middle", io.ErrUnexpectedEOF},
		{"too large", `{"jsonrpc":"2.0","method":"x","params":"` + strings.Repeat("a", 300) + `"}` + "\n", "longer than the maximum of 256", ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream := ok + tt.line
			if strings.HasSuffix(tt.line, "\n") {
				stream += ok
			}
			r := NewReader(strings.NewReader(stream), 256)
			if _, err := r.Read(); err != nil {
				t.Fatal(err)
			}
			_, err := r.Read()
			var de *DesyncError
			if !errors.As(err, &de) || !errors.Is(err, ErrDesync) {
				t.Fatalf("err = %v, want a *DesyncError", err)
			}
			if de.Offset != int64(len(ok)) || de.Line != 2 {
				t.Errorf("offset %d line %d, want %d, 2", de.Offset, de.Line, len(ok))
			}
			if !strings.Contains(de.Reason, tt.reason) {
				t.Errorf("reason %q does not mention %q", de.Reason, tt.reason)
			}
			if tt.err != nil && !errors.Is(err, tt.err) {
				t.Errorf("err %v is not %v", err, tt.err)
			}
			for _, c := range de.Excerpt {
				if c < 0x20 || c > 0x7e {
					t.Errorf("excerpt %q has an unsafe character %q", de.Excerpt, c)
				}
			}
			if len(de.Excerpt) > 2*excerptLen+8 {
				t.Errorf("excerpt is %d bytes", len(de.Excerpt))
			}
			// Never resynchronise: the good message after it stays unread.
			if _, err2 := r.Read(); err2 != err {
				t.Fatalf("after a desync Read returned %v", err2)
			}
		})
	}
}

func TestReadExactMaxSize(t *testing.T) {
	msg := `{"jsonrpc":"2.0","method":"x"}`
	r := NewReader(strings.NewReader(msg+"\n"+msg+"x\n"), len(msg))
	if got, err := r.Read(); err != nil || string(got) != msg {
		t.Fatalf("message of exactly max size: %s, %v", got, err)
	}
	if _, err := r.Read(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("max+1: %v", err)
	}
}

func FuzzReader(f *testing.F) {
	f.Add([]byte(strings.Join(realMessages, "\n") + "\n"))
	for _, m := range realMessages {
		f.Add([]byte(m + "\n"))
	}
	f.Add([]byte("[{\"jsonrpc\":\"2.0\",\"method\":\"x\"}]\n"))
	f.Add([]byte("{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\r\n"))
	f.Add([]byte("npm WARN deprecated\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in), 1024)
		var msgs [][]byte
		for {
			m, err := r.Read()
			if err != nil {
				var de *DesyncError
				if err != io.EOF && !errors.As(err, &de) {
					t.Fatalf("unexpected error type %T: %v", err, err)
				}
				if de != nil && (de.Offset < 0 || de.Offset > int64(len(in))) {
					t.Fatalf("offset %d outside the input", de.Offset)
				}
				break
			}
			if bytes.IndexByte(m, '\n') >= 0 || len(m) > 1024 || !json.Valid(m) {
				t.Fatalf("Read returned %q", m)
			}
			msgs = append(msgs, m)
		}
		// Round trip: what was read, written again as a line, reads back
		// the same.
		var out bytes.Buffer
		for _, m := range msgs {
			out.Write(m)
			out.WriteByte('\n')
		}
		r2 := NewReader(&out, 1024)
		for _, m := range msgs {
			m2, err := r2.Read()
			if err != nil {
				t.Fatalf("re-read of %q: %v", m, err)
			}
			var a, b any
			if json.Unmarshal(m, &a) != nil || json.Unmarshal(m2, &b) != nil {
				t.Fatalf("unmarshal %q / %q", m, m2)
			}
		}
	})
}

// TestReleaseReusesTheBufferCleanly: after Release, Read fails, the
// messages read before stay intact, and a Reader that gets the released
// buffer reads its own stream only, even where the released Reader had
// bytes buffered that it never returned.
func TestReleaseReusesTheBufferCleanly(t *testing.T) {
	first := `{"jsonrpc":"2.0","id":1,"result":{}}` + "\n"
	unread := `{"jsonrpc":"2.0","id":2,"result":{"left":"behind"}}` + "\n"
	for range 20 { // the pool may hand out any buffer: try a few times
		r := NewReader(strings.NewReader(first+unread), 0)
		msg, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		r.Release()
		if _, err := r.Read(); err == nil {
			t.Fatal("Read after Release succeeded")
		}
		r.Release() // twice is harmless
		next := NewReader(strings.NewReader(`{"jsonrpc":"2.0","method":"m"}`+"\n"), 0)
		got, err := next.Read()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != `{"jsonrpc":"2.0","method":"m"}` {
			t.Fatalf("the next Reader read %q", got)
		}
		if _, err := next.Read(); err != io.EOF {
			t.Fatalf("the next Reader's stream went on: %v", err)
		}
		if string(msg) != strings.TrimSuffix(first, "\n") {
			t.Fatalf("a message read before Release changed: %q", msg)
		}
		next.Release()
	}
}
