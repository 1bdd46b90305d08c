package rpcwire

import (
	"errors"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

func TestPending(t *testing.T) {
	p := &Pending{Prefix: "x-"}
	id, ch, err := p.Register()
	if err != nil || id != "x-1" {
		t.Fatalf("%q %v", id, err)
	}
	resp := func(v any) *jsonrpc.Response {
		i, _ := jsonrpc.MakeID(v)
		return &jsonrpc.Response{ID: i}
	}
	if p.Deliver(resp(float64(1))) || p.Deliver(resp("y-1")) {
		t.Fatal("took a response that is not its own")
	}
	if !p.Deliver(resp("x-1")) || (<-ch).ID.Raw() != "x-1" {
		t.Fatal("the response did not reach its request")
	}
	if !p.Deliver(resp("x-1")) {
		t.Fatal("a late answer with the table's prefix must be taken (and dropped)")
	}
	id2, _, _ := p.Register()
	p.Forget(id2)
	_, ch3, _ := p.Register()
	boom := errors.New("boom")
	p.Fail(boom)
	if _, ok := <-ch3; ok {
		t.Fatal("a waiting request was not ended by Fail")
	}
	if _, _, err := p.Register(); !errors.Is(err, boom) || !errors.Is(p.Err(), boom) {
		t.Fatalf("after Fail: %v", err)
	}
}

// TestPendingSaysWhatItDrops: an answer to an id that no longer waits (a
// second answer, or one never asked for) is dropped, and Dropped is told.
func TestPendingSaysWhatItDrops(t *testing.T) {
	var dropped []string
	p := &Pending{Prefix: "x-", Dropped: func(id string) { dropped = append(dropped, id) }}
	id, ch, err := p.Register()
	if err != nil {
		t.Fatal(err)
	}
	rid, _ := jsonrpc.MakeID(id)
	if !p.Deliver(&jsonrpc.Response{ID: rid}) {
		t.Fatal("the answer was not taken")
	}
	<-ch
	p.Deliver(&jsonrpc.Response{ID: rid})
	never, _ := jsonrpc.MakeID("x-999")
	p.Deliver(&jsonrpc.Response{ID: never})
	if len(dropped) != 2 || dropped[0] != id || dropped[1] != "x-999" {
		t.Fatalf("dropped %q", dropped)
	}
}

// TestPendingFailOne: one request failed alone gets its own error; the
// table and the other requests go on.
func TestPendingFailOne(t *testing.T) {
	p := &Pending{Prefix: "x-"}
	id1, ch1, _ := p.Register()
	id2, ch2, _ := p.Register()
	bad := errors.New("bad answer")
	if !p.FailOne(id1, bad) || p.FailOne(id1, bad) {
		t.Fatal("FailOne: the first must take the request, the second nothing")
	}
	if _, ok := <-ch1; ok || !errors.Is(p.ErrOf(id1), bad) {
		t.Fatalf("the failed request: %v", p.ErrOf(id1))
	}
	rid, _ := jsonrpc.MakeID(id2)
	if !p.Deliver(&jsonrpc.Response{ID: rid}) || (<-ch2).ID.Raw() != id2 || p.Err() != nil {
		t.Fatal("the other request did not get its answer")
	}
}

// TestPendingFunc: a request registered with a function ends exactly once,
// whichever ends it: its answer, FailOne, Fail, or Forget (which reports
// that it took the request, and then the function never runs).
func TestPendingFunc(t *testing.T) {
	p := &Pending{Prefix: "x-"}
	var got []string
	f := func(tag string) func(*jsonrpc.Response, error) {
		return func(r *jsonrpc.Response, err error) {
			if r != nil {
				got = append(got, tag+":answer")
			} else {
				got = append(got, tag+":"+err.Error())
			}
		}
	}
	answered, _ := p.RegisterFunc(f("a"))
	one, _ := p.RegisterFunc(f("b"))
	forgotten, _ := p.RegisterFunc(f("c"))
	_, _ = p.RegisterFunc(f("d"))
	id, _ := jsonrpc.MakeID(answered)
	for range 2 { // the second is a late answer: taken and dropped
		if !p.Deliver(&jsonrpc.Response{ID: id}) {
			t.Fatal("an answer with the table's prefix was not taken")
		}
	}
	if !p.FailOne(one, errors.New("bad")) || p.FailOne(one, errors.New("again")) {
		t.Fatal("FailOne did not end the request exactly once")
	}
	if !p.Forget(forgotten) || p.Forget(forgotten) {
		t.Fatal("Forget must report that it took the request, once")
	}
	p.Fail(errors.New("gone"))
	p.Fail(errors.New("twice"))
	if want := []string{"a:answer", "b:bad", "d:gone"}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("ends: %q, want %q (and none for the forgotten %s)", got, want, forgotten)
	}
}
