package gwtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// The bearer tokens of the tests' admin listener and agents.
const (
	AdminToken = "admin-token-0123456789abcdef"
	AgentToken = "agent-token-0123456789abcdef"
)

// Clip cuts s to n bytes, marking the cut.
func Clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// PidAlive reports whether the process runs (a zombie does not).
func PidAlive(pid int) bool {
	// Signal 0 checks existence; a zombie is not alive for us.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// PidOf calls a tool that answers with a process id (the test upstream's
// pid tool) and returns it.
func PidOf(t *testing.T, cs *mcp.ClientSession, tool string) int {
	t.Helper()
	res, err := Call(t, cs, tool, nil)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(FirstText(res))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// Bearer sends a bearer token with every request.
type Bearer struct {
	Tok  string
	Base http.RoundTripper
}

func (b Bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.Tok)
	return b.Base.RoundTrip(r)
}

// AgentClient is the HTTP client of one test agent (with a bearer token,
// "" for none), over a connection pool of its own, as separate agents
// have. Not http.DefaultTransport: net/http's Transport puts a connection
// back in its idle pool when a response without a body arrives, before
// the request's round trip returns, and a deadline that expires in that
// window marks the pooled connection cancelled with the deadline's error.
// The next request to take that connection fails with "context deadline
// exceeded" although its own context has time left. With one pool for
// all, an agent whose calls time out (TestCancellationsRacingTheCallRecord
// cancels 320 calls at random moments) failed another agent's connect
// once in 14 runs of the test command under load.
func AgentClient(token string) *http.Client {
	var rt http.RoundTripper = http.DefaultTransport.(*http.Transport).Clone()
	if token != "" {
		rt = Bearer{Tok: token, Base: rt}
	}
	return &http.Client{Transport: rt}
}

// ConnectWith opens an agent session with a bearer token ("" for none).
func ConnectWith(endpoint, token string) (*mcp.ClientSession, error) {
	hc := AgentClient(token)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "ops-test", Version: "1"}, nil)
	return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
}

// HTTPDo sends a request without a body and returns the status and body.
func HTTPDo(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPolicy is a Cedar policy over the example schema (with a text
// argument): staff may call, a reader only read-only tools, and nobody
// with the text "secret".
const TestPolicy = `
@id("list-all")
permit (principal, action == Action::"list_tools", resource)
unless { principal == Agent::"reader" && !resource.annotations.readOnlyHint };

@id("staff-calls")
permit (principal in Group::"staff", action == Action::"call_tool", resource);

@id("reader-read-only")
permit (principal == Agent::"reader", action == Action::"call_tool", resource)
when { resource.annotations.readOnlyHint };

@id("no-secret")
forbid (principal, action == Action::"call_tool", resource)
when { context.arguments has text && context.arguments.text == "secret" };
`

// PolicyBundle writes a bundle (the example schema with a text argument)
// and returns its directory. The test runs in a package two levels below
// the repository's root.
func PolicyBundle(t *testing.T, policies string) string {
	t.Helper()
	sch, err := os.ReadFile("../../examples/policy/schema.cedarschema")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sch = []byte(strings.Replace(string(sch), "  path?: String,", "  path?: String,\n  text?: String,", 1))
	if err := os.WriteFile(filepath.Join(dir, "schema.cedarschema"), sch, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policy.cedar"), []byte(policies), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// ReadGenesis reads the genesis record of the log in dir and an opener
// for its commitments with id.
func ReadGenesis(t *testing.T, dir string, id age.Identity) (*record.Genesis, *auditlog.Opener) {
	t.Helper()
	r, err := auditlog.NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	e, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	rec, err := e.Decode()
	if err != nil {
		t.Fatal(err)
	}
	g := rec.(*record.Genesis)
	o, err := auditlog.NewOpener(g, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.LoadVault(filepath.Dir(e.Pos.File), id); err != nil {
		t.Fatal(err)
	}
	return g, o
}

// LogEntry is one record of an audit log, decoded, with its index.
type LogEntry struct {
	Index int64
	Kind  record.Kind
	Rec   record.Record
}

// LogEntries reads and decodes every record of the audit log in dir.
func LogEntries(t *testing.T, dir string) []LogEntry {
	t.Helper()
	r, err := auditlog.NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []LogEntry
	for {
		e, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		rec, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, LogEntry{Index: e.Index, Kind: e.Kind, Rec: rec})
	}
}

// AdminRecords returns the admin records in the audit log so far.
func AdminRecords(t *testing.T, dir string) []*record.Admin {
	t.Helper()
	var out []*record.Admin
	for _, e := range LogEntries(t, dir) {
		if a, ok := e.Rec.(*record.Admin); ok {
			out = append(out, a)
		}
	}
	return out
}

// ReadAuditRecords reads and decodes every record of the log in dir.
func ReadAuditRecords(t *testing.T, dir string) []record.Record {
	t.Helper()
	var out []record.Record
	for _, e := range LogEntries(t, dir) {
		out = append(out, e.Rec)
	}
	return out
}

// PostCall POSTs one JSON-RPC request to an HTTP session and returns the
// JSON-RPC message answering it (the response body, or the SSE event that
// carries the response); err when the connection gave no HTTP response.
func PostCall(url, sid, token, body string) (status int, answer string, err error) {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, string(b), err
	}
	answer = string(bytes.TrimSpace(b))
	for _, l := range strings.Split(string(b), "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok && strings.Contains(d, `"id":`) {
			answer = d
		}
	}
	return resp.StatusCode, answer, nil
}

// AnswerCode is the JSON-RPC error code of an answer (0: none).
func AnswerCode(answer string) int64 {
	var m struct {
		Error *struct {
			Code int64 `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(answer), &m) != nil || m.Error == nil {
		return 0
	}
	return m.Error.Code
}

// CallPaths are the two ways an HTTP tools/call is answered: by the fast
// path, or by go-sdk (a _meta member name with an escape, which the fast
// path leaves to go-sdk), as the params' leading members.
var CallPaths = []struct{ Name, Meta string }{
	{"fast", ""},
	{"go-sdk", `"_meta":{"x\u0041":1},`},
}

// WaitForwarded waits until the audit log in dir holds n forwarded call
// records of tool.
func WaitForwarded(t *testing.T, dir, tool string, n int) {
	t.Helper()
	Eventually(t, 20*time.Second, func() string {
		got := 0
		for _, r := range Kinds(ReadRecords(t, dir), "call") {
			if r.Body["tool"] == tool && r.Body["outcome"] == "forwarded" {
				got++
			}
		}
		if got < n {
			return fmt.Sprintf("%d of %d calls forwarded", got, n)
		}
		return ""
	})
}

// CheckCutResult checks the n result records in dir: each call was cut by
// the gateway, answered with code, for a reason naming why.
func CheckCutResult(t *testing.T, dir string, n int, code int64, why string) {
	t.Helper()
	results := Kinds(ReadRecords(t, dir), "result")
	if len(results) != n {
		t.Fatalf("%d result records, want %d: %v", len(results), n, results)
	}
	for _, r := range results {
		b := r.Body
		reason := fmt.Sprint(b["reason"])
		if b["outcome"] != "cancelled" || b["error_code"] != fmt.Sprint(code) || !strings.Contains(reason, "the gateway cut the call") ||
			!strings.Contains(reason, why) || strings.Contains(reason, "the agent cancelled") {
			t.Errorf("a cut call's result record: %v", b)
		}
	}
}

// WaitGoroutine waits until a goroutine of this process is in the state
// its dump's header names (say "sync.Mutex.Lock", "IO wait") with frame
// (say "gateway.(*heldDecisions).Decision(") on its stack: a test holding a lock
// or a full pipe knows that the call it waits for has got there, without
// guessing it with a delay.
func WaitGoroutine(t *testing.T, state, frame string) {
	t.Helper()
	buf := make([]byte, 8<<20)
	Eventually(t, time.Minute, func() string {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			header, stack, _ := strings.Cut(g, "\n")
			if strings.Contains(header, "["+state) && strings.Contains(stack, frame) {
				return ""
			}
		}
		return fmt.Sprintf("no goroutine in %s at %s", state, frame)
	})
}
