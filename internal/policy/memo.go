package policy

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Memo caches the decisions of one bundle for replay, where the same
// request recurs many times. Two requests share a decision when they agree
// on every input the bundle can read: the principal and its groups, the
// action, the tool and its attributes always; the arguments whenever they
// are given (their form alone can deny); the session facts and the time
// only when some policy reads them. It is safe for concurrent use.
type Memo struct {
	b       *Bundle
	m       sync.Map
	n       atomic.Int64
	deps    sync.Map // scope key -> DependsOnArguments
	nDeps   atomic.Int64
	session bool
	now     bool
}

// maxMemo bounds the entries of a Memo; past it, decisions are computed.
const maxMemo = 1 << 16

// NewMemo returns an empty Memo for b.
func (b *Bundle) NewMemo() *Memo {
	return &Memo{b: b, session: b.readsContext("session"), now: b.readsContext("now")}
}

// Decide is b.Decide(r), from the cache when an equivalent request was
// decided before.
func (m *Memo) Decide(r *Request) Decision {
	k := m.key(r)
	if v, ok := m.m.Load(k); ok {
		return v.(Decision)
	}
	d := m.b.Decide(r)
	if m.n.Add(1) <= maxMemo {
		m.m.Store(k, d)
	}
	return d
}

// DependsOnArguments is b.DependsOnArguments(r), from the cache when a
// request with the same principal, action and tool was asked before (the
// scopes it evaluates read nothing else).
func (m *Memo) DependsOnArguments(r *Request) bool {
	var k strings.Builder
	k.Grow(128)
	scopeKey(&k, r)
	key := k.String()
	if v, ok := m.deps.Load(key); ok {
		return v.(bool)
	}
	d := m.b.DependsOnArguments(r)
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
	return k.String()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
