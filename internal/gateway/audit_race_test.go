package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/front/stdiofront"
	"github.com/confidential-mcp/cmcp/internal/gwtest"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

//lint:file-ignore SA1019 go-sdk deprecates MCP logging, sampling and roots (SEP-2577) with no replacement; the gateway still relays them while clients use them

// TestKillSwitchBeatsACallInProgress: a call that passed the early kill
// switch check, and is waiting for its per-session child to start when the
// switch is engaged, is refused (-32064) and never forwarded: no call
// record after kill_switch_on says "forwarded".
func TestKillSwitchBeatsACallInProgress(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			seen := filepath.Join(t.TempDir(), "seen")
			gate := gwtest.NewSlowStart(t)
			k, v := gate.Env()
			h := newHarness(t, hconf{env: map[string]string{k: v, "CMCP_TEST_SEEN": seen}})
			gate.Hold(t) // the session's own child starts when the test says so
			cs := h.connectVia(front, nil)
			errc := make(chan error, 1)
			go func() {
				_, err := call(t, cs, "t__record", map[string]any{"text": "after kill"})
				errc <- err
			}()
			gate.WaitStarted(t) // the call waits for its child
			if err := h.g.SetKillSwitch(context.Background(), true, "test", "incident"); err != nil {
				t.Fatal(err)
			}
			gate.Release()
			if err := <-errc; wireCode(err) != CodeKillSwitch {
				t.Fatalf("the call in progress got %v, want %d", err, CodeKillSwitch)
			}
			killed := false
			for _, e := range logEntries(t, h.dir) {
				switch r := e.Rec.(type) {
				case *record.Admin:
					killed = killed || r.Action == "kill_switch_on"
				case *record.Call:
					if killed && r.Outcome == record.OutcomeForwarded {
						t.Fatalf("call record %d after kill_switch_on says forwarded", e.Index)
					}
				}
			}
			if b, _ := os.ReadFile(seen); len(b) != 0 {
				t.Fatalf("the upstream received %q", b)
			}
		})
	}
}

// TestCancelledCallIsRecorded: a call the agent gives up on while it waits
// (here for its child to start) still has exactly one call record, and a
// forwarded one its result record; the gateway does not mistake the
// cancellation for a failed audit log.
func TestCancelledCallIsRecorded(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			gate := gwtest.NewSlowStart(t)
			k, v := gate.Env()
			h := newHarness(t, hconf{env: map[string]string{k: v}})
			gate.Hold(t)
			cs := h.connectVia(front, nil)
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__echo", Arguments: map[string]any{"text": "x"}})
				errc <- err
			}()
			gate.WaitStarted(t) // the call waits for its child: the agent gives up
			cancel()
			err := <-errc
			gate.Release()
			if err == nil {
				t.Fatal("the call was not cancelled")
			}
			eventually(t, 20*time.Second, func() string {
				if n := len(kinds(h.records(), "call")); n != 1 {
					return "call records: " + strings.Repeat("|", n)
				}
				return ""
			})
			h.g.inflight.Wait()
			h.g.results.Wait()
			checkOneResultPerForwardedCall(t, h)
			if strings.Contains(h.logs.String(), "audit append failed") {
				t.Fatalf("a cancellation was taken for an audit failure:\n%s", clip(h.logs.String(), 2000))
			}
		})
	}
}

// TestCancellationsRacingTheCallRecord: many calls cancelled at random
// moments, in strict durability (every call record waits for fdatasync):
// every forwarded call record has exactly one result record, the upstream
// saw no more calls than were recorded as forwarded, and no cancellation
// is answered as an audit failure.
func TestCancellationsRacingTheCallRecord(t *testing.T) {
	seen := filepath.Join(t.TempDir(), "seen")
	h := newHarness(t, hconf{durability: record.DurabilityStrict, env: map[string]string{"CMCP_TEST_SEEN": seen}})
	var wg sync.WaitGroup
	for range 8 {
		cs := h.connect("", nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(8000))*time.Microsecond)
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "t__record", Arguments: map[string]any{"text": "x"}})
				cancel()
				if wireCode(err) == CodeAuditUnavailable {
					t.Errorf("a cancelled call was answered as an audit failure: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	h.g.inflight.Wait() // the gateway may still work on calls the agents gave up on
	h.g.results.Wait()
	forwarded := checkOneResultPerForwardedCall(t, h)
	b, _ := os.ReadFile(seen)
	if saw := strings.Count(string(b), "\n"); saw > forwarded {
		t.Fatalf("the upstream saw %d calls, but only %d call records say forwarded", saw, forwarded)
	}
}

// checkOneResultPerForwardedCall fails t unless every forwarded call record
// has exactly one result record and every result record a forwarded call;
// it returns the number of forwarded calls.
func checkOneResultPerForwardedCall(t *testing.T, h *harness) int {
	t.Helper()
	fwd := map[int64]int{}
	var results []int64
	for _, e := range logEntries(t, h.dir) {
		switch r := e.Rec.(type) {
		case *record.Call:
			if r.Outcome == record.OutcomeForwarded {
				fwd[e.Index] = 0
			}
		case *record.Result:
			results = append(results, r.Call)
		}
	}
	for _, c := range results {
		n, ok := fwd[c]
		if !ok {
			t.Fatalf("result record for call %d, which is not a forwarded call record", c)
		}
		fwd[c] = n + 1
	}
	for c, n := range fwd {
		if n != 1 {
			t.Fatalf("forwarded call record %d has %d result records", c, n)
		}
	}
	return len(fwd)
}

// TestMalformedCallsAreRecorded: every tools/call gets exactly one call
// record, also one whose params go-sdk cannot decode (answered by go-sdk,
// recorded by the gateway as refused) and one whose arguments are not an
// object (refused with -32602, never forwarded), over both fronts.
func TestMalformedCallsAreRecorded(t *testing.T) {
	cases := []struct {
		params string
		code   float64
	}{
		{`{"name":5}`, -32602},
		{`[]`, -32602},
		{`"t__record"`, -32602},
		{`{"name":"t__record","arguments":5}`, -32602},
		{`{"name":"t__record","arguments":[1]}`, -32602},
		{`{"name":"t__record","arguments":"s"}`, -32602},
		{`{"name":"t__record","arguments":null}`, 0}, // no arguments: forwarded
		{`{"NAME":"t__record"}`, CodeUnknownTool},    // go-sdk matches names by case: no name
	}
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			seen := filepath.Join(t.TempDir(), "seen")
			h := newHarness(t, hconf{env: map[string]string{"CMCP_TEST_SEEN": seen}})
			send := rawSender(t, h, front)
			for i, c := range cases {
				before := len(kinds(h.records(), "call"))
				reply := send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":%s}`, 100+i, c.params))
				var m struct {
					Error *struct {
						Code    float64 `json:"code"`
						Message string  `json:"message"`
					} `json:"error"`
				}
				if err := json.Unmarshal([]byte(reply), &m); err != nil {
					t.Fatalf("%s: reply %q: %v", c.params, reply, err)
				}
				if code := func() float64 {
					if m.Error == nil {
						return 0
					}
					return m.Error.Code
				}(); code != c.code {
					t.Fatalf("%s: reply %s, want code %v", c.params, clip(reply, 300), c.code)
				}
				eventually(t, 5*time.Second, func() string {
					if n := len(kinds(h.records(), "call")) - before; n != 1 {
						return fmt.Sprintf("%s: %d call records, want 1", c.params, n)
					}
					return ""
				})
				calls := kinds(h.records(), "call")
				if want := map[bool]string{true: "refused", false: "forwarded"}[c.code != 0]; calls[len(calls)-1].Body["outcome"] != want {
					t.Fatalf("%s: call record %v, want outcome %s", c.params, calls[len(calls)-1].Body, want)
				}
			}
			if b, _ := os.ReadFile(seen); string(b) != "\n" {
				t.Fatalf("the upstream received %q, want only the call without arguments", b)
			}
		})
	}
}

// TestCallWithSEPHeadersIsRecordedOnce: a tools/call carrying MCP's SEP
// request headers (Mcp-Name, ...), which mean nothing below protocol
// 2026-07-28, gets exactly one call record, whether its params cannot be
// decoded (recorded as refused) or can (forwarded).
func TestCallWithSEPHeadersIsRecordedOnce(t *testing.T) {
	h := newHarness(t, hconf{})
	resp, _ := rawPostResp(t, h.url, "", []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
	sid := resp.Header.Get("Mcp-Session-Id")
	rawPostResp(t, h.url, sid, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	for _, c := range []struct{ params, outcome string }{
		{`{"name":5}`, "refused"},
		{`{"name":"t__echo","arguments":{"text":"x"}}`, "forwarded"},
	} {
		before := len(kinds(h.records(), "call"))
		req, _ := http.NewRequest("POST", h.url, strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":`+c.params+`}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		req.Header.Set("Mcp-Name", "x")
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		eventually(t, 5*time.Second, func() string {
			if n := len(kinds(h.records(), "call")) - before; n != 1 {
				return fmt.Sprintf("%s: %d call records, want 1; reply %s", c.params, n, bytes.TrimSpace(b))
			}
			return ""
		})
		time.Sleep(100 * time.Millisecond) // no second record follows
		calls := kinds(h.records(), "call")
		if len(calls)-before != 1 || calls[len(calls)-1].Body["outcome"] != c.outcome {
			t.Fatalf("%s: call records %v, want one %s", c.params, calls[before:], c.outcome)
		}
	}
}

// TestElicitationOutlivesAShorterCall: an elicitation the upstream sends
// during call A lasts as long as A's request, not as long as call B, which
// started later and ends first while the agent is still answering; with a
// stdio and an HTTP upstream, over both fronts.
func TestElicitationOutlivesAShorterCall(t *testing.T) {
	for _, httpUp := range []bool{false, true} {
		for _, front := range fronts {
			t.Run(fmt.Sprintf("%s front, http upstream %v", front, httpUp), func(t *testing.T) {
				h := newHarness(t, hconf{http: httpUp})
				cs := h.connectVia(front, &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					time.Sleep(500 * time.Millisecond) // a person answering
					return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "ada"}}, nil
				}})
				if _, err := call(t, cs, "t__pid", nil); err != nil { // the child runs
					t.Fatal(err)
				}
				type out struct {
					text string
					err  error
				}
				done := make(chan out, 1)
				go func() {
					res, err := call(t, cs, "t__slowelicit", nil) // elicits after 300 ms
					o := out{err: err}
					if res != nil {
						o.text = firstText(res)
					}
					done <- o
				}()
				time.Sleep(100 * time.Millisecond)
				if _, err := call(t, cs, "t__sleep", map[string]any{"text": "300ms"}); err != nil { // ends at about 400 ms
					t.Fatal(err)
				}
				if o := <-done; o.err != nil || o.text != "elicited: accept ada" {
					t.Fatalf("call A: %q %v", o.text, o.err)
				}
			})
		}
	}
}

// TestSharedSubscriptionsAreCounted: on a shared upstream (one client
// session for every agent), one agent's unsubscribe does not end another's
// subscription: the upstream is unsubscribed only with the last subscriber.
func TestSharedSubscriptionsAreCounted(t *testing.T) {
	h := newHarness(t, hconf{shared: true})
	var bGot atomic.Int32
	a := h.connect("", nil)
	b := h.connect("", &mcp.ClientOptions{ResourceUpdatedHandler: func(context.Context, *mcp.ResourceUpdatedNotificationRequest) {
		bGot.Add(1)
	}})
	ctx := context.Background()
	for _, cs := range []*mcp.ClientSession{b, a} {
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://static"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "test://static"}); err != nil {
		t.Fatal(err)
	}
	before := bGot.Load()
	if _, err := call(t, b, "t__touch", nil); err != nil { // the upstream reports an update
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() string {
		if bGot.Load() == before {
			return "b, still subscribed, got no update after a unsubscribed"
		}
		return ""
	})
}

// TestSharedUpstreamLogsAtTheAgentsLevel: logging/setLevel reaches a shared
// upstream too (at the most verbose level any agent asked for), so its log
// messages reach the agent, as with a per-session upstream.
func TestSharedUpstreamLogsAtTheAgentsLevel(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared %v", shared), func(t *testing.T) {
			h := newHarness(t, hconf{shared: shared})
			var got atomic.Int32
			cs := h.connect("", &mcp.ClientOptions{LoggingMessageHandler: func(context.Context, *mcp.LoggingMessageRequest) { got.Add(1) }})
			if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
				t.Fatal(err)
			}
			if _, err := call(t, cs, "t__progress", nil); err != nil { // logs at info
				t.Fatal(err)
			}
			eventually(t, 5*time.Second, func() string {
				if got.Load() == 0 {
					return "no log message reached the agent"
				}
				return ""
			})
		})
	}
}

// TestCallsWithIDsMCPDoesNotAllowAreRefused: a tools/call whose id is not
// a string or an integer within ±2^53 (1.5, 1e2, 2^53+1, null) is answered
// with an invalid-request error that says why, and recorded as refused.
// Before, 1.5 and 2^53+1 were read as 1 and 2^53 (two calls could share
// an id and one get the other's answer), and a null id on stdio was taken
// for a notification and never answered (found in review).
func TestCallsWithIDsMCPDoesNotAllowAreRefused(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			seen := filepath.Join(t.TempDir(), "seen")
			h := newHarness(t, hconf{env: map[string]string{"CMCP_TEST_SEEN": seen}})
			send := rawSender(t, h, front)
			for _, id := range []string{"1.5", "1e2", "9007199254740993", "null"} {
				before := len(kinds(h.records(), "call"))
				reply := send(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"t__record","arguments":{"x":1}}}`)
				var m struct {
					Error *struct {
						Code    float64 `json:"code"`
						Message string  `json:"message"`
					} `json:"error"`
				}
				if err := json.Unmarshal([]byte(reply), &m); err != nil || m.Error == nil || m.Error.Code != -32600 || !strings.Contains(m.Error.Message, "id") {
					t.Fatalf("id %s: reply %s", id, clip(reply, 300))
				}
				eventually(t, 5*time.Second, func() string {
					calls := kinds(h.records(), "call")
					if n := len(calls) - before; n != 1 {
						return fmt.Sprintf("id %s: %d call records, want 1", id, n)
					}
					if calls[len(calls)-1].Body["outcome"] != "refused" {
						return fmt.Sprintf("id %s: call record %v", id, calls[len(calls)-1].Body)
					}
					return ""
				})
			}
			if b, _ := os.ReadFile(seen); len(b) != 0 {
				t.Fatalf("the upstream received %q", b)
			}
		})
	}
}

// TestCallRecordHoldsTheRequestID: a call record carries the JSON-RPC id as
// the agent sent it (FORMAT.md request_id), so that a record can be matched
// to its request; none was ever written before (found in review).
func TestCallRecordHoldsTheRequestID(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			h := newHarness(t, hconf{})
			send := rawSender(t, h, front)
			for _, id := range []string{`4242`, `"req-α"`} {
				before := len(kinds(h.records(), "call"))
				send(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"x"}}}`)
				eventually(t, 5*time.Second, func() string {
					calls := kinds(h.records(), "call")
					if len(calls) == before {
						return "no call record"
					}
					got, _ := json.Marshal(calls[len(calls)-1].Body["request_id"])
					var want any
					json.Unmarshal([]byte(id), &want)
					wantB, _ := json.Marshal(want)
					if string(got) != string(wantB) {
						return fmt.Sprintf("request_id %s, want %s", got, wantB)
					}
					return ""
				})
			}
		})
	}
}

// TestResponsesKeepTheirIDs: the id checks are for requests. An agent's
// answer to the gateway's own request (elicitation, sampling, ping) whose id
// is spelled 7.0 is taken as before, on both fronts, and never answered
// with an error (found in review of the id checks).
func TestResponsesKeepTheirIDs(t *testing.T) {
	for _, l := range []string{`{"jsonrpc":"2.0","id":7.0,"result":{}}`, `{"jsonrpc":"2.0","id":1e0,"result":{}}`} {
		if msg, _, code, why := stdiofront.DecodeLine([]byte(l)); msg == nil {
			t.Errorf("stdio: %s refused (%d %s)", l, code, why)
		}
	}
	h := newHarness(t, hconf{})
	resp, _ := rawPostResp(t, h.url, "", []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
	session := resp.Header.Get("Mcp-Session-Id")
	rawPostResp(t, h.url, session, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	if r, b := rawPostResp(t, h.url, session, []byte(`{"jsonrpc":"2.0","id":7.0,"result":{}}`)); r.StatusCode != http.StatusAccepted {
		t.Errorf("http: a response with id 7.0: %d %s", r.StatusCode, b)
	}
}

// TestRepeatedMemberNamesInACallAreRefused: a tools/call that repeats a
// member name ("name" twice, a repeated argument, the id twice) is refused
// on both fronts, recorded as refused with its request_id (none when the id
// is what repeats), and nothing is forwarded; before, it skipped the fast
// path and go-sdk forwarded the last "name" with no request_id in its
// record. A call go-sdk refuses as undecodable is recorded with its
// request_id too.
func TestRepeatedMemberNamesInACallAreRefused(t *testing.T) {
	for _, front := range fronts {
		t.Run(front, func(t *testing.T) {
			h := newHarness(t, hconf{})
			send := rawSender(t, h, front)
			for _, tc := range []struct {
				name, line string
				code       int64
				id         any // in the answer and the record; nil: none
				tool       string
				says       string
			}{
				{"name twice", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"a"},"name":"t__pid"}}`,
					jsonrpc.CodeInvalidParams, float64(7), "", `the member "name" appears twice`},
				{"argument twice", `{"jsonrpc":"2.0","id":"x8","method":"tools/call","params":{"name":"t__echo","arguments":{"text":"a","text":"b"}}}`,
					jsonrpc.CodeInvalidParams, "x8", "t__echo", `arguments: a member name is repeated (in an object at depth 1 of the arguments)`},
				{"id twice", `{"jsonrpc":"2.0","id":9,"method":"tools/call","id":10,"params":{"name":"t__echo","arguments":{"text":"a"}}}`,
					jsonrpc.CodeInvalidRequest, nil, "t__echo", `the member "id" appears twice`},
				{"undecodable", `{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":5}}`,
					jsonrpc.CodeInvalidParams, float64(11), "", ""},
			} {
				t.Run(tc.name, func(t *testing.T) {
					before := len(kinds(h.records(), "call"))
					var reply struct {
						ID    any            `json:"id"`
						Error *jsonrpc.Error `json:"error"`
					}
					got := send(tc.line)
					if err := json.Unmarshal([]byte(got), &reply); err != nil || reply.Error == nil || reply.Error.Code != tc.code ||
						reply.ID != tc.id || !strings.Contains(reply.Error.Message, tc.says) {
						t.Fatalf("answer %s; want error %d saying %q, id %v", got, tc.code, tc.says, tc.id)
					}
					var call rec
					eventually(t, 5*time.Second, func() string {
						calls := kinds(h.records(), "call")
						if len(calls) != before+1 {
							return fmt.Sprintf("%d call records, want %d", len(calls)-before, 1)
						}
						call = calls[len(calls)-1]
						return ""
					})
					if call.Body["outcome"] != "refused" || call.Body["request_id"] != tc.id || (call.Body["tool"] != nil && call.Body["tool"] != tc.tool) ||
						(tc.tool != "" && call.Body["tool"] != tc.tool) {
						t.Fatalf("call record %v; want refused, request_id %v, tool %q", call.Body, tc.id, tc.tool)
					}
				})
			}
			if n := len(kinds(h.records(), "result")); n != 0 {
				t.Fatalf("%d result records: a refused call was forwarded", n)
			}
			if got := send(`{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"t__echo","arguments":{"text":"still here"}}}`); !strings.Contains(got, "still here") {
				t.Fatalf("a call after the refusals: %s", got)
			}
		})
	}
}
