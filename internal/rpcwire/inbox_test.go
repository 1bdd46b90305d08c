package rpcwire

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

func TestInbox(t *testing.T) {
	ctx := context.Background()
	b := NewInbox()
	boom := errors.New("child wrote garbage")
	go func() {
		for i := int64(1); i <= 3; i++ {
			id, _ := jsonrpc.MakeID(float64(i))
			if !b.Deliver(&jsonrpc.Request{ID: id, Method: "ping"}) {
				return
			}
		}
		b.Fail(boom)
	}()
	for i := 1; i <= 3; i++ {
		msg, err := b.Read(ctx)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if r := msg.(*jsonrpc.Request); r.ID.Raw() != int64(i) {
			t.Fatalf("read %d got id %v: messages out of order", i, r.ID.Raw())
		}
	}
	if _, err := b.Read(ctx); !errors.Is(err, boom) {
		t.Fatalf("after the loop failed Read = %v, want its error", err)
	}
	if _, err := b.Read(ctx); !errors.Is(err, boom) {
		t.Fatalf("the failure must stick, got %v", err)
	}

	c := NewInbox()
	if !c.Close() || c.Close() {
		t.Fatal("Close must report true exactly once")
	}
	if _, err := c.Read(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("Read after Close = %v, want EOF", err)
	}
	if c.Deliver(&jsonrpc.Request{Method: "ping"}) {
		t.Fatal("Deliver after Close must return false")
	}
	d := NewInbox()
	tctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := d.Read(tctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read with an expired context = %v", err)
	}
}
