package rpcwire

import (
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Pending is a table of requests cmcp sends itself, beside an SDK session
// on the same connection, waiting for their responses. Their ids are
// strings Prefix+n, which never collide with go-sdk's integer ids.
type Pending struct {
	Prefix string

	mu   sync.Mutex
	next uint64
	m    map[string]waiter
	err  error            // the connection failed: every request fails with this
	one  map[string]error // requests failed alone (FailOne), until ErrOf reads them
	// Dropped, if set, is told of an answer whose request no longer
	// waits (it ended, was cancelled, or was never sent): it is dropped.
	Dropped func(id string)
}

// waiter is one request's wait: a channel (Register) or a function
// (RegisterFunc).
type waiter struct {
	ch chan *jsonrpc.Response
	f  func(*jsonrpc.Response, error)
}

// Register returns a fresh request id and the channel its response arrives
// on (closed if the table fails first), or the table's failure.
func (p *Pending) Register() (string, <-chan *jsonrpc.Response, error) {
	ch := make(chan *jsonrpc.Response, 1)
	id, err := p.register(waiter{ch: ch})
	if err != nil {
		return "", nil, err
	}
	return id, ch, nil
}

// RegisterFunc returns a fresh request id whose end runs f once, in the
// goroutine that ends it: with the response (in the read loop that calls
// Deliver), or with why there is none (Fail, FailOne). A request given up
// with Forget, which reports true then, does not run f. f is never called
// with the table's lock held.
func (p *Pending) RegisterFunc(f func(*jsonrpc.Response, error)) (string, error) {
	return p.register(waiter{f: f})
}

func (p *Pending) register(w waiter) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return "", p.err
	}
	if p.m == nil {
		p.m = map[string]waiter{}
	}
	p.next++
	id := p.Prefix + strconv.FormatUint(p.next, 10)
	p.m[id] = w
	return id, nil
}

// Forget gives up waiting for id; it reports whether id was waiting (so
// that nothing else ends its wait).
func (p *Pending) Forget(id string) bool {
	p.mu.Lock()
	_, ok := p.m[id]
	delete(p.m, id)
	p.mu.Unlock()
	return ok
}

// Deliver hands resp to the request it answers; it reports whether resp
// carries one of the table's ids (a late answer to a request given up is
// taken and dropped).
func (p *Pending) Deliver(resp *jsonrpc.Response) bool {
	id, ok := resp.ID.Raw().(string)
	if !ok || !strings.HasPrefix(id, p.Prefix) {
		return false
	}
	p.mu.Lock()
	w, ok := p.m[id]
	delete(p.m, id)
	p.mu.Unlock()
	switch {
	case w.f != nil:
		w.f(resp, nil)
	case ok:
		w.ch <- resp
	case p.Dropped != nil:
		p.Dropped(id)
	}
	return true
}

// Fail ends every waiting request (its channel is closed, or its function
// runs with err once the lock is let go) and makes every
// later Register fail with err. The first failure is kept.
func (p *Pending) Fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	err = p.err
	var fs []func(*jsonrpc.Response, error)
	for id, w := range p.m {
		if w.f != nil {
			fs = append(fs, w.f)
		} else {
			close(w.ch)
		}
		delete(p.m, id)
	}
	p.mu.Unlock()
	for _, f := range fs {
		f(nil, err)
	}
}

// FailOne ends the wait for id alone with err: its channel is closed, and
// ErrOf(id) gives err. It reports whether id was waiting.
func (p *Pending) FailOne(id string, err error) bool {
	p.mu.Lock()
	w, ok := p.m[id]
	if !ok {
		p.mu.Unlock()
		return false
	}
	delete(p.m, id)
	if w.f != nil {
		p.mu.Unlock()
		w.f(nil, err)
		return true
	}
	if p.one == nil {
		p.one = map[string]error{}
	}
	p.one[id] = err
	close(w.ch)
	p.mu.Unlock()
	return true
}

// ErrOf is why the wait for id ended without a response (its channel was
// closed): its own failure (FailOne), else the table's.
func (p *Pending) ErrOf(id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err, ok := p.one[id]; ok {
		delete(p.one, id)
		return err
	}
	return p.err
}

// Err is the table's failure, or nil.
func (p *Pending) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}
