package gateway

import (
	"encoding/json"
	"testing"
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
