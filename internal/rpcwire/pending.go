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
	m    map[string]chan *jsonrpc.Response
	err  error            // the connection failed: every request fails with this
	one  map[string]error // requests failed alone (FailOne), until ErrOf reads them
	// Dropped, if set, is told of an answer whose request no longer
	// waits (it ended, was cancelled, or was never sent): it is dropped.
	Dropped func(id string)
}

// Register returns a fresh request id and the channel its response arrives
// on (closed if the table fails first), or the table's failure.
func (p *Pending) Register() (string, <-chan *jsonrpc.Response, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return "", nil, p.err
	}
	if p.m == nil {
		p.m = map[string]chan *jsonrpc.Response{}
	}
	p.next++
	id := p.Prefix + strconv.FormatUint(p.next, 10)
	ch := make(chan *jsonrpc.Response, 1)
	p.m[id] = ch
	return id, ch, nil
}

// Forget gives up waiting for id.
func (p *Pending) Forget(id string) {
	p.mu.Lock()
	delete(p.m, id)
	p.mu.Unlock()
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
	ch := p.m[id]
	delete(p.m, id)
	p.mu.Unlock()
	if ch != nil {
		ch <- resp
	} else if p.Dropped != nil {
		p.Dropped(id)
	}
	return true
}

// Fail ends every waiting request (its channel is closed) and makes every
// later Register fail with err. The first failure is kept.
func (p *Pending) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
	for id, ch := range p.m {
		close(ch)
		delete(p.m, id)
	}
}

// FailOne ends the wait for id alone with err: its channel is closed, and
// ErrOf(id) gives err. It reports whether id was waiting.
func (p *Pending) FailOne(id string, err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := p.m[id]
	if ch == nil {
		return false
	}
	delete(p.m, id)
	if p.one == nil {
		p.one = map[string]error{}
	}
	p.one[id] = err
	close(ch)
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
