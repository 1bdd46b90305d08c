package stdiofront

import (
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// TestUnanswered: the session's end and the end of a stdio agent's input
// wait for the requests read before they began, not for those read
// after (an agent that keeps sending cannot hold the end up); an id in
// use counts once; closing the connection ends every wait.
func TestUnanswered(t *testing.T) {
	id := func(n int64) jsonrpc.ID { i, _ := jsonrpc.MakeID(float64(n)); return i }
	var u Unanswered
	if !u.read(id(1)) || !u.read(id(2)) {
		t.Fatal("a request with a new id is not tracked")
	}
	if u.read(id(2)) { // a duplicate: answered at once by go-sdk, with no id
		t.Fatal("a duplicate id is tracked as a request of its own (the fast path would answer the first one's entry)")
	}
	if u.read(jsonrpc.ID{}) {
		t.Fatal("a notification is tracked")
	}
	done := make(chan int, 1)
	go func() { done <- u.Wait(nil) }()
	u.answered(id(1))
	time.Sleep(20 * time.Millisecond)
	u.read(id(3)) // read after the wait began
	select {
	case left := <-done:
		t.Fatalf("wait returned %d with request 2 unanswered", left)
	case <-time.After(50 * time.Millisecond):
	}
	u.answered(id(2))
	select {
	case left := <-done:
		if left != 0 {
			t.Fatalf("wait returned %d, want 0", left)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return once the requests read before it were answered")
	}
	stop := make(chan struct{})
	close(stop)
	if left := u.Wait(stop); left != 1 {
		t.Fatalf("wait with request 3 unanswered, stopped: %d, want 1", left)
	}
	go func() { done <- u.Wait(nil) }()
	time.Sleep(20 * time.Millisecond)
	u.close()
	select {
	case left := <-done:
		if left != 1 {
			t.Fatalf("wait ended by close: %d, want 1", left)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not end the wait")
	}
}
