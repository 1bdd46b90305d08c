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

func (m *Memo) key(r *Request) string {
	var k strings.Builder
	field := func(s string) {
		k.WriteString(strconv.Itoa(len(s)))
		k.WriteByte(':')
		k.WriteString(s)
	}
	field(string(r.Action))
	field(r.Agent)
	k.WriteString(strconv.Itoa(len(r.Groups)))
	for _, g := range r.Groups {
		field(g)
	}
	field(r.Tool)
	field(r.ToolName)
	field(r.Upstream)
	field(r.EvidenceClass)
	for _, h := range []bool{r.Annotations.ReadOnly, r.Annotations.Destructive, r.Annotations.Idempotent, r.Annotations.OpenWorld} {
		k.WriteByte("01"[btoi(h)])
	}
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
