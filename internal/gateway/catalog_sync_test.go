package gateway

import (
	"sort"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestSessionToolsFollowTheNewestCatalog: of concurrent catalog rebuilds,
// the newest catalog is the one a session shows once they are done (found
// in review: rebuildMu covered the store but not the sessions' syncTools,
// so an older list could reach a session last).
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
		var want, got []string
		for _, e := range h.g.Catalog().Entries() {
			want = append(want, e.Exposed)
		}
		s.mu.Lock()
		for n := range s.visible {
			got = append(got, n)
		}
		s.mu.Unlock()
		sort.Strings(want)
		sort.Strings(got)
		if len(want) != len(got) {
			t.Fatalf("round %d: stored catalog %v, session shows %v: an older snapshot reached the session last", round, want, got)
		}
	}
}
