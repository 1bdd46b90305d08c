package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func init() { childModes["lines"] = lineChild }

// lineChild reads its stdin as the TypeScript and Python SDKs' stdio
// servers do: a line at a time, each line taken for one message, and a
// line that is not one skipped. It serves the tools echo and forbidden and
// appends the name and arguments of every call it runs to CMCP_TEST_SEEN.
func lineChild() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	reply := func(id json.RawMessage, result string) {
		fmt.Printf(`{"jsonrpc":"2.0","id":%s,"result":%s}`+"\n", id, result)
	}
	for in.Scan() {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"params"`
		}
		if json.Unmarshal(in.Bytes(), &m) != nil {
			continue
		}
		switch m.Method {
		case "initialize":
			reply(m.ID, `{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"lines","version":"1"}}`)
		case "tools/list":
			reply(m.ID, `{"tools":[{"name":"echo","inputSchema":{"type":"object"}},{"name":"forbidden","inputSchema":{"type":"object"}}]}`)
		case "tools/call":
			f, err := os.OpenFile(os.Getenv("CMCP_TEST_SEEN"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err == nil {
				fmt.Fprintf(f, "%s %s\n", m.Params.Name, m.Params.Arguments)
				f.Close()
			}
			reply(m.ID, `{"content":[{"type":"text","text":"ran `+m.Params.Name+`"}]}`)
		case "ping":
			reply(m.ID, `{}`)
		}
	}
}

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
