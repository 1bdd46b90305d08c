package policy

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Memo caches the decisions of one bundle. Replay uses one per bundle, where
// the same request recurs many times; a running engine uses one for the
// bundle in force (NewLiveMemo). Two requests share a decision when they
// agree on every input the bundle can read: the principal and its groups,
// the action, the tool (or the upstream) and its attributes always; the
// arguments whenever they are given (their form alone can deny); the
// session facts, the time, the URI and the prompt name only when some
// policy reads them. The key is those inputs
// themselves, not a hash of them, so two requests share a decision only if
// Cedar could not tell them apart. Decisions handed out share their slices:
// callers must not modify them. It is safe for concurrent use.
type Memo struct {
	b       *Bundle
	m       sync.Map
	n       atomic.Int64
	deps    sync.Map // scope key -> DependsOnArguments
	nDeps   atomic.Int64
	session bool
	now     bool
	uri     bool
	prompt  bool
	// max bounds the entries (when full, the cache starts again empty);
	// keys longer than maxKey bytes are never cached (0: no limit).
	max, maxKey int
	hits        atomic.Int64
}

// maxMemo bounds the entries of a replay Memo.
const maxMemo = 1 << 16

// Bounds of a live Memo: at most liveMemoEntries decisions of requests
// whose key (arguments included) is at most liveMemoKey bytes, about 2 MiB.
const (
	liveMemoEntries = 1024
	liveMemoKey     = 2048
)

// NewMemo returns an empty Memo for b.
func (b *Bundle) NewMemo() *Memo {
	return &Memo{b: b, session: b.readsContext("session"), now: b.readsContext("now"),
		uri: b.readsContext("uri"), prompt: b.readsContext("prompt"), max: maxMemo}
}

// NewLiveMemo returns a bounded Memo for a running engine, or nil when no
// request could ever be decided from it: a bundle that reads the session
// facts or the time sees a new input on every call.
func (b *Bundle) NewLiveMemo() *Memo {
	m := b.NewMemo()
	if m.session || m.now {
		return nil
	}
	m.max, m.maxKey = liveMemoEntries, liveMemoKey
	return m
}

// Hits is the number of decisions given from the cache.
func (m *Memo) Hits() int64 { return m.hits.Load() }

// Decide is b.Decide(r), from the cache when an equivalent request was
// decided before.
func (m *Memo) Decide(r *Request) Decision {
	if m.maxKey > 0 && len(r.Arguments) > m.maxKey {
		return m.b.Decide(r)
	}
	k := m.key(r)
	if m.maxKey > 0 && len(k) > m.maxKey {
		return m.b.Decide(r)
	}
	if v, ok := m.m.Load(k); ok {
		m.hits.Add(1)
		return v.(Decision)
	}
	d := m.b.Decide(r)
	if m.n.Add(1) > int64(m.max) {
		m.m.Clear()
		m.n.Store(1)
	}
	m.m.Store(k, d)
	return d
}

// DependsOnURI is b.DependsOnURI(r), cached as DependsOnArguments is.
func (m *Memo) DependsOnURI(r *Request) bool {
	return m.depends("u", r, m.b.DependsOnURI)
}

// DependsOnArguments is b.DependsOnArguments(r), from the cache when a
// request with the same principal, action and tool was asked before (the
// scopes it evaluates read nothing else).
func (m *Memo) DependsOnArguments(r *Request) bool {
	return m.depends("", r, m.b.DependsOnArguments)
}

// depends caches f(r) under r's scope key, prefix telling the questions
// apart.
func (m *Memo) depends(prefix string, r *Request, f func(*Request) bool) bool {
	var k strings.Builder
	k.Grow(128)
	k.WriteString(prefix)
	scopeKey(&k, r)
	key := k.String()
	if v, ok := m.deps.Load(key); ok {
		return v.(bool)
	}
	d := f(r)
	if m.nDeps.Add(1) <= maxMemo {
		m.deps.Store(key, d)
	}
	return d
}

func field(k *strings.Builder, s string) {
	k.WriteString(strconv.Itoa(len(s)))
	k.WriteByte(':')
	k.WriteString(s)
}

// scopeKey writes the inputs of a request other than its context: the
// principal and its groups, the action, the tool and its attributes.
func scopeKey(k *strings.Builder, r *Request) {
	field(k, string(r.Action))
	field(k, r.Agent)
	k.WriteString(strconv.Itoa(len(r.Groups)))
	for _, g := range r.Groups {
		field(k, g)
	}
	field(k, r.Tool)
	field(k, r.ToolName)
	field(k, r.Upstream)
	field(k, r.EvidenceClass)
	field(k, r.Machine)
	for _, h := range [...]bool{r.Annotations.ReadOnly, r.Annotations.Destructive, r.Annotations.Idempotent, r.Annotations.OpenWorld} {
		k.WriteByte("01"[btoi(h)])
	}
}

func (m *Memo) key(r *Request) string {
	var k strings.Builder
	k.Grow(128 + len(r.Arguments))
	scopeKey(&k, r)
	field := func(s string) { field(&k, s) }
	if r.Arguments != nil {
		k.WriteByte('a')
		field(string(r.Arguments))
	}
	if m.session {
		k.WriteByte('s')
		field(r.Session.ID)
		k.WriteString(strconv.FormatInt(r.Session.Calls, 10))
		k.WriteString(strconv.Itoa(len(r.Session.ToolsUsed)))
		for _, t := range r.Session.ToolsUsed {
			field(t)
		}
	}
	if m.now {
		k.WriteByte('t')
		k.WriteString(strconv.FormatInt(r.Time.UnixMilli(), 10))
	}
	if m.uri && r.Action == ActionReadResource {
		k.WriteByte('u')
		field(r.URI)
	}
	if m.prompt && r.Action == ActionGetPrompt {
		k.WriteByte('p')
		field(r.Prompt)
	}
	return k.String()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
