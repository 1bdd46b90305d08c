package connect

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/tunnel/wire"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

func newClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "test-gateway", Version: "1"}, nil)
}

// call makes a raw tools/call on conn and returns the text of its result.
func call(ctx context.Context, conn *upstream.Conn, tool string, args string) (string, error) {
	params := json.RawMessage(`{"name":"` + tool + `","arguments":` + args + `}`)
	res, err := conn.RawCall(ctx, "tools/call", params)
	if err != nil {
		return "", err
	}
	var r struct {
		Content []struct{ Text string } `json:"content"`
	}
	if err := json.Unmarshal(res, &r); err != nil || len(r.Content) == 0 {
		return "", errors.New("unexpected result " + string(res))
	}
	return r.Content[0].Text, nil
}

// TestTwoMachinesOneUpstream: two connectors with the same server
// register under one upstream; a connection reaches each by machine id
// through real TCP, each on a child of its own machine.
func TestTwoMachinesOneUpstream(t *testing.T) {
	g := startGateway(t, "", tunnel.Options{})
	runConnector(t, Options{Gateway: g.url(), MachineID: "lab-1", Stdio: serverSpec(t, "one")})
	runConnector(t, Options{Gateway: g.url(), MachineID: "lab-2", Stdio: serverSpec(t, "two")})
	waitMachines(t, g.hub, "lab-1", "lab-2")

	up := upstream.NewTunnel("files", g.hub)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := up.Connect(ctx, newClient(), upstream.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if conn.Class != upstream.ClassTunnel || conn.Machine != "lab-1" {
		t.Fatalf("class %q machine %q, want tunnel on lab-1", conn.Class, conn.Machine)
	}
	tools, err := conn.Session.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 3 {
		t.Fatalf("tools/list through the tunnel: %v %v", tools, err)
	}
	for id, want := range map[string]string{"lab-1": "one", "lab-2": "two"} {
		on, err := conn.OnMachine(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := call(ctx, on, "whoami", "{}")
		if err != nil || got != want {
			t.Fatalf("whoami on %s = %q, %v; want %q", id, got, err, want)
		}
	}
	if _, err := conn.OnMachine(ctx, "lab-9"); !errors.Is(err, upstream.ErrNoMachine) || !strings.Contains(err.Error(), "lab-1, lab-2") {
		t.Fatalf("unknown machine: %v, want ErrNoMachine listing the live ones", err)
	}
	info := g.hub.Machine("files", "lab-2").Info()
	if info.Server.Class != upstream.ClassSpawnMeasured || info.Server.Digest == "" || info.Host.OS == "" {
		t.Fatalf("machine facts %+v", info)
	}
}

// TestDuplicateMachineIDRefused: a second connector claiming a live
// machine id is refused (the first keeps it), and registers once the
// first is gone, within its backoff.
func TestDuplicateMachineIDRefused(t *testing.T) {
	g := startGateway(t, "", tunnel.Options{})
	_, stop1 := runConnector(t, Options{Gateway: g.url(), MachineID: "lab-1", Stdio: serverSpec(t, "first")})
	waitMachines(t, g.hub, "lab-1")
	states, _ := runConnector(t, Options{Gateway: g.url(), MachineID: "lab-1", Stdio: serverSpec(t, "second")})
	s := <-states
	var re *RefusedError
	if s.Kind != "refused" || !errors.As(s.Err, &re) || re.Code != wire.CodeDuplicate || !strings.Contains(re.Reason, `"lab-1"`) {
		t.Fatalf("second connector: %+v, want refused as duplicate naming lab-1", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := upstream.NewTunnel("files", g.hub).Connect(ctx, newClient(), upstream.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := call(ctx, conn, "whoami", "{}"); got != "first" {
		t.Fatalf("lab-1 is served by %q, want the first connector", got)
	}
	conn.Close()
	old := g.hub.Machine("files", "lab-1")
	stop1()
	<-old.Done()
	waitMachines(t, g.hub, "lab-1")
	conn, err = upstream.NewTunnel("files", g.hub).Connect(ctx, newClient(), upstream.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got, _ := call(ctx, conn, "whoami", "{}"); got != "second" {
		t.Fatalf("lab-1 is served by %q, want the second connector now", got)
	}
}

// TestMachineGoneMidCall: the tunnel is cut while a call waits; the call
// fails at once with an error naming the machine.
func TestMachineGoneMidCall(t *testing.T) {
	g := startGateway(t, "", tunnel.Options{})
	p := startProxy(t, g.addr)
	runConnector(t, Options{Gateway: p.url(), MachineID: "lab-7", Stdio: serverSpec(t, "x"), InitialBackoff: time.Hour, MaxBackoff: time.Hour})
	waitMachines(t, g.hub, "lab-7")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := upstream.NewTunnel("files", g.hub).Connect(ctx, newClient(), upstream.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	errc := make(chan error, 1)
	waiting := make(chan struct{})
	go func() {
		_, err := call(upstream.WithWaiting(ctx, func() { close(waiting) }), conn, "block", "{}")
		errc <- err
	}()
	<-waiting
	p.cut()
	err = <-errc
	if err == nil || !strings.Contains(err.Error(), `machine "lab-7" of upstream "files" went away`) {
		t.Fatalf("call during the cut: %v, want the machine named as gone", err)
	}
	waitMachines(t, g.hub)
}

// TestHalfOpenDropped: the connection stalls without closing (no FIN, no
// pong): the gateway drops the machine within two heartbeats.
func TestHalfOpenDropped(t *testing.T) {
	hb := time.Second
	g := startGateway(t, "", tunnel.Options{Heartbeat: hb})
	p := startProxy(t, g.addr)
	runConnector(t, Options{Gateway: p.url(), MachineID: "lab-3", Stdio: serverSpec(t, "x"), InitialBackoff: time.Hour, MaxBackoff: time.Hour})
	waitMachines(t, g.hub, "lab-3")
	m := g.hub.Machine("files", "lab-3")
	close(p.stall)
	start := time.Now()
	<-m.Done()
	took := time.Since(start)
	if !strings.Contains(m.Err().Error(), "no pong") {
		t.Fatalf("dropped for %v, want no pong", m.Err())
	}
	// Two heartbeats, and what a loaded 2-core machine adds to timers.
	if took > 2*hb+time.Second {
		t.Fatalf("half-open tunnel dropped after %v, want within two heartbeats (%v)", took, 2*hb)
	}
	t.Logf("half-open tunnel dropped after %v (heartbeat %v)", took, hb)
}

// TestGatewayRestartReconnects: the gateway goes away and comes back on
// the same address: every connector registers again within its backoff.
func TestGatewayRestartReconnects(t *testing.T) {
	g := startGateway(t, "", tunnel.Options{})
	var all []chan State
	for _, id := range []string{"a", "b", "c"} {
		st, _ := runConnector(t, Options{Gateway: g.url(), MachineID: id, Stdio: serverSpec(t, id)})
		all = append(all, st)
	}
	waitMachines(t, g.hub, "a", "b", "c")
	addr := g.addr
	g.stop()
	g2 := startGateway(t, addr, tunnel.Options{})
	waitMachines(t, g2.hub, "a", "b", "c")
	for _, st := range all {
		for s := range st {
			if s.Kind == "disconnected" {
				if s.Wait > 500*time.Millisecond {
					t.Fatalf("waited %v, over the longest backoff", s.Wait)
				}
				break
			}
		}
	}
}

// TestWrongTokenWaitsTheLongestBackoff: a refused token is not retried in
// a tight loop.
func TestWrongTokenWaitsTheLongestBackoff(t *testing.T) {
	g := startGateway(t, "", tunnel.Options{})
	states, _ := runConnector(t, Options{Gateway: g.url(), Token: "wrong", MachineID: "lab-1", Stdio: serverSpec(t, "x"), InitialBackoff: 10 * time.Millisecond, MaxBackoff: 2 * time.Second})
	s := <-states
	var re *RefusedError
	if !errors.As(s.Err, &re) || re.Code != wire.CodeUnauthorized || s.Wait < time.Second {
		t.Fatalf("wrong token: %+v, want unauthorized and a wait of at least half the longest backoff", s)
	}
	if strings.Contains(s.Err.Error(), "wrong") {
		t.Fatalf("the refusal repeats the token: %v", s.Err)
	}
	select {
	case s := <-states:
		if time.Duration(0) < s.Wait && s.Wait < time.Second {
			t.Fatalf("second attempt waited %v", s.Wait)
		}
	case <-time.After(500 * time.Millisecond):
	}
}

// TestTokenForAnotherMachineRefused: a token bound to machine ids does
// not register another id.
func TestTokenForAnotherMachineRefused(t *testing.T) {
	g := startGateway(t, "", tunnel.Options{Upstreams: []tunnel.Upstream{{Name: "files", Tokens: []tunnel.Token{{SHA256: tokenSum(testToken), Machines: []string{"lab-1"}}}}}})
	states, _ := runConnector(t, Options{Gateway: g.url(), MachineID: "lab-2", Stdio: serverSpec(t, "x"), MaxBackoff: 5 * time.Second})
	s := <-states
	var re *RefusedError
	if !errors.As(s.Err, &re) || re.Code != wire.CodeUnauthorized {
		t.Fatalf("%+v, want unauthorized", s)
	}
	runConnector(t, Options{Gateway: g.url(), MachineID: "lab-1", Stdio: serverSpec(t, "x")})
	waitMachines(t, g.hub, "lab-1")
}
