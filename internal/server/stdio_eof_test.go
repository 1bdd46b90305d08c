package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
	"github.com/confidential-mcp/cmcp/internal/gateway"
)

// TestServeStdioAnswersWhatItReadBeforeEOF: an agent that writes its
// requests and closes cmcp's stdin (`printf ... | cmcp serve --stdio`: EOF
// means it is done sending, not that it stopped reading) gets every one of
// them handled as usual: initialize answered, the tools/call decided,
// recorded, forwarded and answered on stdout before cmcp exits 0 with its
// children stopped and its log sealed. A call still running
// server.shutdown_grace after the EOF is cut as on a signal: cancelled
// upstream, answered -32068, recorded as cut by the shutdown, with a
// warning. Before, go-sdk ended the session at the EOF: nothing was
// written, and a call not yet dispatched was not even recorded.
//
// The grace is 30 s where the call must be answered (it is answered long
// before: nothing waits for the grace), and 1 s where it must be cut; there
// the EOF comes once the call is forwarded, so that the call is running
// when the grace starts, however long its child took to start.
func TestServeStdioAnswersWhatItReadBeforeEOF(t *testing.T) {
	const (
		initialize  = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}`
		initialized = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	)
	cases := []struct {
		name string
		// first: initialize is written, and answered, before the rest,
		// so that the session is bound and the fast path takes the call;
		// otherwise everything goes in one write.
		first bool
		meta  string // the params' leading members (an escaped _meta name: go-sdk answers)
		tool  string
		text  string
		want  string // the answer's text; "" for a call the grace cuts
	}{
		{name: "one write", tool: "t__echo", text: "hi", want: "echo: hi"},
		{name: "one write/go-sdk", meta: `"_meta":{"x\u0041":1},`, tool: "t__echo", text: "hi", want: "echo: hi"},
		{name: "fast path", first: true, tool: "t__echo", text: "hi", want: "echo: hi"},
		{name: "cut/one write", tool: "t__sleep", text: "10s"},
		{name: "cut/go-sdk", meta: `"_meta":{"x\u0041":1},`, tool: "t__sleep", text: "10s"},
		{name: "cut/fast path", first: true, tool: "t__sleep", text: "10s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			grace := 30 * time.Second
			if tc.want == "" {
				grace = time.Second
			}
			st, in, out := startServeStdio(t, "server", fmt.Sprintf("  shutdown_grace: %s\n", grace))
			lines := readStdout(out)
			call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"` + tc.tool + `",` + tc.meta + `"arguments":{"text":"` + tc.text + `"}}}`
			var answers []string
			rest := initialize + "\n" + initialized + "\n" + call + "\n"
			if tc.first {
				if _, err := in.Write([]byte(initialize + "\n")); err != nil {
					t.Fatal(err)
				}
				select {
				case l := <-lines:
					answers = append(answers, l.text)
				case <-time.After(20 * time.Second):
					t.Fatalf("initialize was not answered\n%s", st.logs.String())
				}
				rest = initialized + "\n" + call + "\n"
			}
			fastBefore := st.g.FastPathCalls()
			if _, err := in.Write([]byte(rest)); err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				waitForwarded(t, filepath.Join(st.dir, "audit"), tc.tool, 1) // the call runs
			}
			// The EOF's time is taken before the close: taken after it, a
			// test goroutine preempted between the two (two CPU hogs did
			// it) saw the gateway's grace start before "the EOF" and the
			// cut 5 ms short of the grace.
			eof := time.Now()
			in.Close()
			timeout := time.After(time.Minute)
			var answered time.Time // the call's answer
		read:
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						break read
					}
					answers = append(answers, l.text)
					if strings.Contains(l.text, `"id":2`) {
						answered = l.at
					}
				case <-timeout:
					t.Fatalf("stdout was not closed; read %q\n%s", answers, st.logs.String())
				}
			}
			st.wait(t) // Serve returns nil: exit 0
			byID := map[string]map[string]json.RawMessage{}
			for _, l := range answers {
				var m map[string]json.RawMessage
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Fatalf("stdout line %q: %v", l, err)
				}
				byID[string(m["id"])] = m
			}
			if len(answers) != 2 || byID["1"]["result"] == nil || !strings.Contains(string(byID["1"]["result"]), `"protocolVersion"`) {
				t.Fatalf("stdout after EOF: %q, want the answers to initialize and the call\n%s", answers, st.logs.String())
			}
			audit := filepath.Join(st.dir, "audit")
			calls := kinds(readRecords(t, audit), "call")
			if len(calls) != 1 || calls[0].Body["tool"] != tc.tool || calls[0].Body["outcome"] != "forwarded" {
				t.Fatalf("call records: %v", calls)
			}
			// In one write, the call reaches the fast path only if the
			// session was bound before it was read.
			if fast := st.g.FastPathCalls() - fastBefore; tc.first && fast != 1 || tc.meta != "" && fast != 0 {
				t.Errorf("%d calls took the fast path", fast)
			}
			answer := byID["2"]
			if tc.want != "" {
				var res struct {
					Content []struct{ Text string } `json:"content"`
				}
				if err := json.Unmarshal(answer["result"], &res); err != nil || len(res.Content) != 1 || res.Content[0].Text != tc.want {
					t.Fatalf("the call's answer: %q, want %q", answers, tc.want)
				}
				results := kinds(readRecords(t, audit), "result")
				if len(results) != 1 || results[0].Body["outcome"] != "ok" {
					t.Fatalf("result records: %v", results)
				}
			} else {
				var e struct {
					Code    int64  `json:"code"`
					Message string `json:"message"`
				}
				if err := json.Unmarshal(answer["error"], &e); err != nil || e.Code != gateway.CodeShuttingDown || !strings.Contains(e.Message, "server.shutdown_grace") {
					t.Fatalf("the cut call's answer: %q, want %d", answers, gateway.CodeShuttingDown)
				}
				// Cut at the grace: not before, and long before the call
				// would have ended (it sleeps 10 s).
				if took := answered.Sub(eof); took < grace || took > grace+4*time.Second {
					t.Errorf("the cut call was answered %v after the EOF, want shutdown_grace (%v)", took, grace)
				}
				if !strings.Contains(st.logs.String(), "cutting them") {
					t.Errorf("no warning of the cut call:\n%s", st.logs.String())
				}
				checkCutResult(t, audit, 1, gateway.CodeShuttingDown, "gateway shutdown")
			}
			checkStoppedLog(t, audit, st.logs.String())
		})
	}
}

// stdoutLine is a line the gateway wrote to its stdout, and when it was read.
type stdoutLine struct {
	text string
	at   time.Time
}

// readStdout reads the gateway's stdout line by line until it is closed.
func readStdout(out io.Reader) <-chan stdoutLine {
	lines := make(chan stdoutLine, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- stdoutLine{sc.Text(), time.Now()}
		}
	}()
	return lines
}

// TestServeStdioRequestToAgentAfterEOFFailsAtOnce: once a stdio agent has
// closed its input it can answer no sampling, elicitation or roots request;
// an upstream's request to it fails at once (-32071, saying why), and the
// call that sent it is answered and the gateway stops, instead of both
// waiting out server.shutdown_grace for an answer that cannot come.
func TestServeStdioRequestToAgentAfterEOFFailsAtOnce(t *testing.T) {
	const (
		initialize  = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{},"elicitation":{}},"clientInfo":{"name":"sh","version":"1"}}}`
		initialized = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
		grace       = 20 * time.Second
	)
	for _, tc := range []struct {
		tool string
		sent bool // the EOF comes after the request reached the agent
	}{{"t__sample", false}, {"t__elicit", false}, {"t__sample", true}} {
		tool := tc.tool
		name := tool
		if tc.sent {
			name += "/sent before the EOF"
		}
		t.Run(name, func(t *testing.T) {
			st, in, out := startServeStdio(t, "server", fmt.Sprintf("  shutdown_grace: %s\n", grace))
			lines := readStdout(out)
			call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"` + tool + `","arguments":{"text":"hi"}}}`
			if _, err := in.Write([]byte(initialize + "\n" + initialized + "\n" + call + "\n")); err != nil {
				t.Fatal(err)
			}
			var answer string
			timeout := time.After(grace)
			if tc.sent {
				for l := range lines {
					if strings.Contains(l.text, `"method":"sampling/createMessage"`) {
						break // the agent has it, and will never answer
					}
				}
			}
			in.Close()
			eof := time.Now()
		read:
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						break read
					}
					if strings.Contains(l.text, `"id":2`) && !strings.Contains(l.text, `"method"`) {
						answer = l.text
					}
				case <-timeout:
					t.Fatalf("stdout was not closed before shutdown_grace; the call's answer: %q\n%s", answer, st.logs.String())
				}
			}
			st.wait(t)
			if took := time.Since(eof); took > grace/2 {
				t.Errorf("the gateway stopped %v after the EOF: it waited for the agent's answer", took)
			}
			// The child's tool fails with the gateway's error (go-sdk makes
			// a tool's error an isError result).
			if !strings.Contains(answer, "closed its input") || !strings.Contains(answer, fmt.Sprint(gateway.CodeSessionEnded)) && !strings.Contains(answer, `"isError":true`) {
				t.Fatalf("the call's answer: %q, want the error saying the agent closed its input", answer)
			}
			calls := kinds(readRecords(t, filepath.Join(st.dir, "audit")), "call")
			if len(calls) != 1 || calls[0].Body["outcome"] != "forwarded" {
				t.Fatalf("call records: %v", calls)
			}
			checkStoppedLog(t, filepath.Join(st.dir, "audit"), st.logs.String())
		})
	}
}

// TestServeStdioAnswerSentBeforeEOFIsUsed: an agent that answers a
// sampling request and closes its input at once (its answer and the EOF
// read together) gets its call answered with what it sampled: only the
// requests it had not answered are withdrawn at the EOF. Before, every
// request sent to the agent was withdrawn at the EOF, its answer queued
// for go-sdk included.
func TestServeStdioAnswerSentBeforeEOFIsUsed(t *testing.T) {
	// go-sdk gets the agent's answer only once the EOF after it has been
	// read and handled (as it may when the two are read together).
	var eof atomic.Bool
	stdiofront.TestHookAgentRead = func(msg jsonrpc.Message) {
		if _, ok := msg.(*jsonrpc.Response); ok {
			for !eof.Load() {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Cleanup(func() { stdiofront.TestHookAgentRead = nil })
	const (
		initialize  = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{}},"clientInfo":{"name":"sh","version":"1"}}}`
		initialized = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
		grace       = 20 * time.Second
	)
	for i := range 5 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			st, in, out := startServeStdio(t, "server", fmt.Sprintf("  shutdown_grace: %s\n", grace))
			lines := readStdout(out)
			call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t__sample","arguments":{"text":"hi"}}}`
			if _, err := in.Write([]byte(initialize + "\n" + initialized + "\n" + call + "\n")); err != nil {
				t.Fatal(err)
			}
			timeout := time.After(grace)
			var answer string
		read:
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						break read
					}
					var m struct {
						ID     json.RawMessage `json:"id"`
						Method string          `json:"method"`
					}
					if err := json.Unmarshal([]byte(l.text), &m); err != nil {
						t.Fatalf("stdout line %q: %v", l.text, err)
					}
					switch {
					case m.Method == "sampling/createMessage":
						// The answer and the EOF in one go.
						res := `{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"model":"m","role":"assistant","content":{"type":"text","text":"yes"}}}`
						if _, err := in.Write([]byte(res + "\n")); err != nil {
							t.Fatal(err)
						}
						in.Close()
						eof.Store(true)
					case string(m.ID) == "2" && m.Method == "":
						answer = l.text
					}
				case <-timeout:
					t.Fatalf("stdout was not closed before shutdown_grace; the call's answer: %q\n%s", answer, st.logs.String())
				}
			}
			st.wait(t)
			if !strings.Contains(answer, "sampled: yes") {
				t.Fatalf("the call's answer: %q, want the text the agent sampled before closing its input", answer)
			}
		})
	}
}
