package gateway

import (
	"bytes"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestSessionToolsFollowTheNewestCatalog: of concurrent catalog rebuilds,
// the newest catalog is the one a session shows once they are done (found
// in review: rebuildMu covered the store but not the sessions' syncTools,
// so an older list could reach a session last).
//
// First deterministically: sync A reads the catalog and is held there
// (testHookCatalogRead) while a rebuild stores a newer catalog and syncs
// the session (B); A is let go once B has either finished (syncs not
// serialised: B showed the newer tools and A would now show the older
// ones last) or waits for A's turn; then the session must show the newer
// catalog. Then 300 rounds of 4 concurrent rebuilds (run with -race too).
func TestSessionToolsFollowTheNewestCatalog(t *testing.T) {
	h := newHarness(t, hconf{shared: true})
	cs := h.connect("", nil)
	defer cs.Close()
	st := h.g.ups["t"]
	st.mu.Lock()
	full := append([]*mcp.Tool(nil), st.tools...)
	st.mu.Unlock()
	if len(full) < 2 {
		t.Fatalf("need >=2 tools, have %d", len(full))
	}
	sessions := h.g.sessionList()
	if len(sessions) != 1 {
		t.Fatalf("%d sessions", len(sessions))
	}
	s := sessions[0]
	shows := func() (want, got []string) {
		for _, e := range h.g.Catalog().Entries() {
			want = append(want, e.Exposed)
		}
		got = s.tools.Names()
		sort.Strings(want)
		sort.Strings(got)
		return want, got
	}
	setTools := func(tools []*mcp.Tool) {
		st.mu.Lock()
		st.tools = tools
		st.mu.Unlock()
	}

	setTools(full[1:])
	h.g.rebuildCatalog()
	aRead, releaseA := make(chan struct{}), make(chan struct{})
	var calls int
	hook := func(*session) {
		calls++ // A's call happens before B's can: B is started after aRead
		if calls == 1 {
			close(aRead)
			<-releaseA
		}
	}
	testHookCatalogRead.Store(&hook)
	defer testHookCatalogRead.Store(nil)
	aDone, bDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(aDone); s.syncTools() }()
	<-aRead
	setTools(full)
	go func() { defer close(bDone); h.g.rebuildCatalog() }()
	for deadline := time.Now().Add(time.Minute); ; {
		select {
		case <-bDone:
		default:
			if !waitsForALockIn("toollist.(*List).Sync") {
				if time.Now().After(deadline) {
					t.Fatal("the second sync neither finished nor waits for the first")
				}
				time.Sleep(time.Millisecond)
				continue
			}
		}
		break
	}
	close(releaseA)
	<-aDone
	<-bDone
	testHookCatalogRead.Store(nil)
	if want, got := shows(); len(want) != len(full) || len(got) != len(want) {
		t.Fatalf("the newest catalog holds %v, the session shows %v: the sync that read an older catalog was applied last", want, got)
	}

	for round := range 300 {
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				st.mu.Lock()
				if (round+i)%2 == 0 {
					st.tools = full
				} else {
					st.tools = full[1:]
				}
				st.mu.Unlock()
				h.g.rebuildCatalog()
			})
		}
		wg.Wait()
		want, got := shows()
		if len(want) != len(got) {
			t.Fatalf("round %d: stored catalog %v, session shows %v: an older snapshot reached the session last", round, want, got)
		}
	}
}

// waitsForALockIn reports whether a goroutine is blocked on a sync.Mutex
// that fn called Lock on.
func waitsForALockIn(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		head, body, _ := bytes.Cut(g, []byte("\n"))
		if !bytes.Contains(head, []byte("[sync.Mutex.Lock")) {
			continue
		}
		// The first frame outside package sync is the one that locked.
		for _, line := range bytes.Split(body, []byte("\n")) {
			if bytes.HasPrefix(line, []byte("\t")) || bytes.HasPrefix(line, []byte("runtime.")) ||
				bytes.Contains(line, []byte("sync.")) && !bytes.Contains(line, []byte("gateway.")) {
				continue
			}
			if bytes.Contains(line, []byte(fn+"(")) {
				return true
			}
			break
		}
	}
	return false
}
