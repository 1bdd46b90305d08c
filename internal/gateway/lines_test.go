package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLineBreaksInACallNeverReachAStdioChild: an agent on HTTP may send
// its tools/call with line breaks between the tokens of its arguments and
// _meta. A stdio child reads one message a line, so the call goes to it
// without them: otherwise a line holding a whole message of its own (here
// an array element, and a _meta member) would be run by a child that reads
// line by line as a request nobody decided or recorded.
func TestLineBreaksInACallNeverReachAStdioChild(t *testing.T) {
	seen := filepath.Join(t.TempDir(), "seen")
	h := newHarness(t, hconf{mode: "lines", env: map[string]string{"CMCP_TEST_SEEN": seen}, callTimeout: 5 * time.Second})
	const smuggled = `{"jsonrpc":"2.0","id":"evil","method":"tools/call","params":{"name":"forbidden","arguments":{}}}`
	got := rawExchange(t, h, "http", `{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"t__echo",`+
		"\"arguments\":{\"l\":[\r\n"+smuggled+"\n]},\r\"_meta\":{\"k\":\n"+smuggled+"\n}}}")
	if last := got[len(got)-1]; !strings.Contains(last, `"id":"x","result"`) || !strings.Contains(last, "ran echo") {
		t.Errorf("the agent's call: %q", got)
	}
	b, _ := os.ReadFile(seen)
	if want := `echo {"l":[` + smuggled + "]}\n"; string(b) != want {
		t.Errorf("the child ran:\n%s\nwant only the agent's call, without line breaks:\n%s", b, want)
	}
	if n := len(kinds(h.records(), "call")); n != 1 {
		t.Errorf("%d call records, want 1", n)
	}
}
