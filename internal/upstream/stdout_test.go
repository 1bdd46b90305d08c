package upstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/framing"
)

// answerInitialize is a shell fragment that answers the MCP handshake:
// the initialize request (with its id) and the initialized notification.
var answerInitialize = `read -r line
id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"` + ProtocolVersion + `","capabilities":{"tools":{}},"serverInfo":{"name":"s","version":"1"}}}\n' "$id"
read -r line
`

// connectScript spawns a script child and connects to it, returning the
// connection, the channel its exit event arrives on, and the error.
func connectScript(t *testing.T, body string) (*Conn, <-chan ExitEvent, error) {
	t.Helper()
	p, d := writeScript(t, "#!/bin/sh\n"+body)
	exits := make(chan ExitEvent, 1)
	up := &Stdio{Spec: StdioSpec{Name: "s", Command: p, Pin: d, InterpreterPin: shPin(t), StopGrace: time.Second}, Hooks: Hooks{Exit: func(ev ExitEvent) { exits <- ev }}, Share: "per-session"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := up.Connect(ctx, mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil), ConnectOptions{})
	if conn != nil {
		t.Cleanup(func() { conn.Close() })
	}
	return conn, exits, err
}

func exitEvent(t *testing.T, exits <-chan ExitEvent) ExitEvent {
	t.Helper()
	select {
	case ev := <-exits:
		return ev
	case <-time.After(20 * time.Second):
		t.Fatal("the child did not end")
		return ExitEvent{}
	}
}

// TestChildLineOverTheLimit: a child whose reply is a well-formed JSON-RPC
// message on one line longer than 16 MiB is stopped, and the agent's
// error and the exit record say that the line exceeds the limit, not that
// it is not JSON-RPC (it starts like one).
func TestChildLineOverTheLimit(t *testing.T) {
	body := `read -r line
printf '{"jsonrpc":"2.0","id":1,"result":{"text":"'
head -c ` + fmt.Sprint(maxFrame+1024) + ` /dev/zero | tr '\0' a
printf '"}}\n'
sleep 3600
`
	_, exits, err := connectScript(t, body)
	if !errors.Is(err, framing.ErrTooLarge) || !strings.Contains(err.Error(), "longer than the limit of 16 MiB") || strings.Contains(err.Error(), "not a JSON-RPC message") {
		t.Fatalf("connect to a child whose answer is over the limit: %v", err)
	}
	if ev := exitEvent(t, exits); !strings.Contains(ev.Fault, "longer than the limit of 16 MiB") {
		t.Fatalf("exit event %+v", ev)
	}
}

// TestChildClosingStdoutIsStoppedWithTheReason: a child that closes its
// stdout and keeps running (during the handshake, or later) is stopped by
// the gateway, and the agent's error and the exit record's reason say
// that it closed its stdout, not merely that it was killed by SIGTERM (the
// signal the gateway sent it because of that).
func TestChildClosingStdoutIsStoppedWithTheReason(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
		handshook        bool
	}{
		{"during the handshake", "exec 1>&-\nsleep 3600\n", "closed its stdout during the MCP handshake but kept running", false},
		{"while serving", answerInitialize + "exec 1>&-\nsleep 3600\n", "closed its stdout while it was serving but kept running", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, exits, err := connectScript(t, tc.body)
			if (err == nil) != tc.handshook {
				t.Fatalf("connect: %v", err)
			}
			if tc.handshook {
				// The handshake was done: the next call fails with the reason.
				ev := exitEvent(t, exits)
				if !strings.Contains(ev.Fault, tc.want) || ev.Signal == "" {
					t.Fatalf("exit event %+v, want fault %q and the signal", ev, tc.want)
				}
				_, err = conn.RawCall(context.Background(), "tools/call", callParams("x", "{}"))
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("call after the child closed its stdout: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "killed by signal") {
				t.Fatalf("connect: %v, want %q", err, tc.want)
			}
			if ev := exitEvent(t, exits); !strings.Contains(ev.Fault, tc.want) {
				t.Fatalf("exit event %+v, want fault %q", ev, tc.want)
			}
		})
	}
}
