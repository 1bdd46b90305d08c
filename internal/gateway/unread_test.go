package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// dialSmallWindow connects to addr with a small receive buffer, so that an
// answer the test does not read fills the connection quickly.
func dialSmallWindow(t *testing.T, addr string) net.Conn { return dialWindow(t, addr, 4096) }

// dialWindow connects to addr with a receive buffer of size bytes.
func dialWindow(t *testing.T, addr string, size int) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, size) })
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// bigEchoCall is a tools/call of t__echo with n '<', which the child's
// JSON encoder sends as \u003c, twice (content and structured content):
// an answer about 12n bytes long.
func bigEchoCall(id string, n int) string {
	return `{"jsonrpc":"2.0","id":"` + id + `","method":"tools/call","params":{"name":"t__echo","arguments":{"text":"` + strings.Repeat("<", n) + `"}}}`
}

// postOn writes one POST of body on conn, in session sid.
func postOn(t *testing.T, conn net.Conn, host, sid, body string) {
	t.Helper()
	req := fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
		"Mcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Length: %d\r\n\r\n%s", host, sid, len(body), body)
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
}

// slowReader reads at most step bytes at a time, pausing between reads.
type slowReader struct {
	r     io.Reader
	step  int
	pause time.Duration
}

func (s slowReader) Read(p []byte) (int, error) {
	time.Sleep(s.pause)
	return s.r.Read(p[:min(len(p), s.step)])
}

// pacedReader reads at most step bytes every pause, by the clock: once
// started, a read waits for its slot in the schedule, and one late (the
// reader descheduled, collecting garbage) is followed at once by the next,
// at most two pauses behind.
type pacedReader struct {
	r     io.Reader
	step  int
	pause time.Duration
	next  time.Time // zero: not started, not paced
}

func (s *pacedReader) start() { s.next = time.Now() }

func (s *pacedReader) Read(p []byte) (int, error) {
	if !s.next.IsZero() {
		now := time.Now()
		if s.next = s.next.Add(s.pause); s.next.Before(now.Add(-2 * s.pause)) {
			s.next = now.Add(-2 * s.pause)
		}
		time.Sleep(s.next.Sub(now))
	}
	return s.r.Read(p[:min(len(p), s.step)])
}

// TestUnreadAnswerEndsItsSession: the answer to a POST that the agent
// never reads (its connection open, its window full) is given up once
// writing it makes no progress for HTTPOptions.WriteStallTimeout: the
// request is over, so the session is idle and reaped at
// server.session_timeout, its child stopped; the call's result record
// says the answer was not delivered. A reader that is slow but keeps
// reading gets the whole answer, however long it takes, and a call's
// event stream that waits longer than the bound between two events (an
// elicitation the agent answers late) is not cut.
func TestUnreadAnswerEndsItsSession(t *testing.T) {
	const stall = time.Second
	t.Run("never read", func(t *testing.T) {
		// Small buffers on both ends, so that an answer of 1.8 MB (not
		// the 10 MB the kernel's autotuned buffers would hold) fills them.
		h := newHarness(t, hconf{idle: 2 * time.Second, stall: stall, sndbuf: 64 << 10})
		cs := h.connect("", nil)
		r, err := call(t, cs, "t__pid", nil)
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(firstText(r))
		if !pidAlive(pid) {
			t.Fatalf("child pid %q", firstText(r))
		}
		addr := h.srv.Listener.Addr().String()
		conn := dialSmallWindow(t, addr)
		postOn(t, conn, addr, cs.ID(), bigEchoCall("big", 150_000))
		// The answer is never read; the connection stays open.
		start := time.Now()
		eventually(t, time.Minute, func() string {
			if n := h.g.Sessions(); n != 0 {
				return fmt.Sprintf("%d sessions", n)
			}
			if pidAlive(pid) {
				return fmt.Sprintf("the session's child %d still runs", pid)
			}
			return ""
		})
		t.Logf("session ended %v after the call", time.Since(start).Round(100*time.Millisecond))
		var found bool
		for _, res := range kinds(h.records(), "result") {
			reason, _ := res.Body["reason"].(string)
			if strings.Contains(reason, "not delivered") {
				found = true
				if res.Body["outcome"] != "ok" || !strings.Contains(reason, stall.String()) {
					t.Errorf("result record of the unread answer: %v", res.Body)
				}
			}
		}
		if !found {
			t.Errorf("no result record says the answer was not delivered: %v", kinds(h.records(), "result"))
		}
	})

	t.Run("slow reader", func(t *testing.T) {
		// Small buffers on both ends (the kernel's autotuned ones hold
		// megabytes), so that the gateway's writes wait for the reader.
		h := newHarness(t, hconf{idle: 2 * time.Second, stall: stall, sndbuf: 64 << 10})
		cs := h.connect("", nil)
		addr := h.srv.Listener.Addr().String()
		conn := dialWindow(t, addr, 64<<10)
		postOn(t, conn, addr, cs.ID(), bigEchoCall("slow", 150_000))
		start := time.Now()
		// 32 KiB every 50 ms: far slower than the answer could go, never
		// a second without progress.
		resp, err := http.ReadResponse(bufio.NewReaderSize(slowReader{r: conn, step: 32 << 10, pause: 50 * time.Millisecond}, 64<<10), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		took := time.Since(start)
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"slow"`) || !strings.Contains(string(b), `"result"`) || len(b) < 1_500_000 {
			t.Fatalf("slow reader got %d, %d bytes, %v", resp.StatusCode, len(b), err)
		}
		if took < 3*stall {
			t.Fatalf("the answer took %v to read: too fast to show that a slow reader is not cut (want over %v)", took, 3*stall)
		}
		for _, res := range kinds(h.records(), "result") {
			if res.Body["reason"] != nil {
				t.Errorf("result record of a delivered answer: %v", res.Body)
			}
		}
	})

	t.Run("slow reader, the kernel's own buffers", func(t *testing.T) {
		// The kernel's autotuned buffers hold megabytes: without a bound
		// on what a connection queues unsent (LowWatermarkListener), a
		// blocked write went on only once about a third of that had
		// drained, which a reader at this pace takes longer than the
		// stall bound to read, and the answer was cut part way.
		//
		// Those are the gateway's send buffers. The agent's receive
		// buffer is set (256 KiB, which ends its autotuning): one
		// autotuned up to tcp_rmem's 32 MiB keeps its window shut until
		// a sixteenth of it is free again (the receiver's silly window
		// avoidance), a second at this pace, and the answer was cut at
		// the same byte (2,830,336) in most runs on a loaded machine,
		// by the reader's kernel, not the gateway's.
		//
		// The stall bound is the other subtests' second (it was 500 ms):
		// with two CPU hogs on a loaded machine the test process, the
		// gateway's writer and the reader both, went without the CPU for
		// half a second. Without LowWatermarkListener the answer is still
		// cut (at 4,436,884 bytes, 2 runs of 2): a write waits for about a
		// third of several MB of queue to drain, well over a second at
		// this pace.
		h := newHarness(t, hconf{idle: 2 * time.Second, stall: stall})
		cs := h.connect("", nil)
		addr := h.srv.Listener.Addr().String()
		conn := dialWindow(t, addr, 256<<10)
		postOn(t, conn, addr, cs.ID(), bigEchoCall("steady", 700_000)) // about 8.4 MB
		// 64 KiB every 60 ms (about 1 MB/s) once the answer begins: never
		// a stall bound without reading. The pace is kept by the clock
		// (pacedReader), and the body read into a buffer that needs no
		// growing: on a loaded machine a reader that slept 60 ms after
		// each read, and copied megabytes as io.ReadAll grew its buffer,
		// fell to a third of that pace, and stopped for up to a second.
		pr := &pacedReader{r: conn, step: 64 << 10, pause: 60 * time.Millisecond}
		resp, err := http.ReadResponse(bufio.NewReaderSize(pr, 64<<10), nil)
		if err != nil {
			t.Fatal(err)
		}
		pr.start()
		body := bytes.NewBuffer(make([]byte, 0, 9<<20))
		_, err = body.ReadFrom(resp.Body)
		b := body.Bytes()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"steady"`) || !strings.Contains(string(b), `"result"`) || len(b) < 8_000_000 {
			t.Fatalf("steady reader got %d, %d bytes, %v", resp.StatusCode, len(b), err)
		}
		for _, res := range kinds(h.records(), "result") {
			if res.Body["reason"] != nil {
				t.Errorf("result record of a delivered answer: %v", res.Body)
			}
		}
	})

	t.Run("late event on the call's stream", func(t *testing.T) {
		h := newHarness(t, hconf{idle: 10 * time.Second, stall: stall})
		cs := h.connect("", &mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			time.Sleep(3 * stall)
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "late"}}, nil
		}})
		r, err := call(t, cs, "t__elicit", nil)
		if err != nil || !strings.Contains(firstText(r), "late") {
			t.Fatalf("elicitation answered after %v: %v %v", 3*stall, firstText(r), err)
		}
	})
}
