package gateway

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestWarnDriftReachesExistingSessions: a shared upstream's tool changes
// during a session under drift: warn (its description, and readOnlyHint
// dropped). The catalog takes the flagged definition, on which the policy
// decides: a session that was already listing is sent list_changed and
// shown the same definition as a new session, not the old one.
func TestWarnDriftReachesExistingSessions(t *testing.T) {
	h := newHarness(t, hconf{mode: "changer", shared: true, driftWarn: true})
	var changed atomic.Int32
	a := h.connect("", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) }})
	echo := func(cs *mcp.ClientSession) *mcp.Tool {
		lt, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range lt.Tools {
			if tl.Name == "t__echo" {
				return tl
			}
		}
		t.Fatal("t__echo not listed")
		return nil
	}
	if e := echo(a); e.Description != "v1: reads only" || e.Annotations == nil || !e.Annotations.ReadOnlyHint {
		t.Fatalf("before: %+v", e)
	}
	if _, err := call(t, a, "t__change", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() string {
		if e, _ := h.g.Catalog().Lookup("t__echo"); e.Tool.Description != "v2: deletes everything" {
			return "the catalog does not have the flagged definition"
		}
		if changed.Load() == 0 {
			return "the existing session was not sent tools/list_changed"
		}
		return ""
	})
	got, fresh := echo(a), echo(h.connect("", nil))
	if got.Description != "v2: deletes everything" || (got.Annotations != nil && got.Annotations.ReadOnlyHint) {
		t.Fatalf("the existing session is shown %q annotations %+v, not the definition the policy decides on", got.Description, got.Annotations)
	}
	if g, f := fmt.Sprintf("%q %+v", got.Description, got.Annotations), fmt.Sprintf("%q %+v", fresh.Description, fresh.Annotations); g != f {
		t.Fatalf("two sessions of one shared upstream are shown different definitions: %s and %s", g, f)
	}
	flagged := false
	for _, d := range kinds(h.records(), "drift") {
		flagged = flagged || (d.Body["tool"] == "echo" && d.Body["action"] == "flagged")
	}
	if !flagged {
		t.Fatal("no flagged drift record")
	}
}

// TestUnchangedCatalogSendsNoListChanged: rebuilding the catalog with the
// same definitions (a shared upstream re-listed the same tools) sends the
// agent nothing: list_changed follows what it is shown.
func TestUnchangedCatalogSendsNoListChanged(t *testing.T) {
	h := newHarness(t, hconf{shared: true})
	var changed atomic.Int32
	cs := h.connect("", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) }})
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	h.g.rebuildCatalog()
	h.g.rebuildCatalog()
	time.Sleep(300 * time.Millisecond)
	if n := changed.Load(); n != 0 {
		t.Fatalf("%d tools/list_changed for an unchanged catalog", n)
	}
}

// TestConcurrentCatalogRebuildsStoreTheNewestSnapshot: rebuilds that run at
// once (a shared reconnect and a re-list) are serialised, so the catalog
// state stored last is the one read last: after every round of concurrent
// rebuilds, each following its own change of an upstream's state, the
// gateway shows that upstream's final state (its instructions here). Run
// with -race too.
func TestConcurrentCatalogRebuildsStoreTheNewestSnapshot(t *testing.T) {
	h := newHarness(t, hconf{shared: true})
	st := h.g.ups["t"]
	if st == nil {
		t.Fatal("no upstream t")
	}
	var n int
	for round := range 50 {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 5 {
					st.mu.Lock()
					n++
					init := &mcp.InitializeResult{Instructions: fmt.Sprintf("version %d", n)}
					if st.init != nil {
						cp := *st.init
						cp.Instructions = init.Instructions
						init = &cp
					}
					st.init = init
					st.mu.Unlock()
					h.g.rebuildCatalog()
				}
			})
		}
		wg.Wait()
		h.g.mu.Lock()
		got := h.g.instructions
		h.g.mu.Unlock()
		if want := fmt.Sprintf("version %d", n); got != want {
			t.Fatalf("round %d: after concurrent rebuilds the gateway shows %q, the upstream's state is %q: an older snapshot was stored last", round, got, want)
		}
	}
}
