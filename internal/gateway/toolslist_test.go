package gateway

import (
	"github.com/confidential-mcp/cmcp/internal/toolprobe"

	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// listsBy is how many tools/list requests the child pid answered, as the
// pager counts them in the file f (a line with its pid each).
func listsBy(f, pid string) int {
	b, _ := os.ReadFile(f)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if l == pid {
			n++
		}
	}
	return n
}

// upstreamFailures are the reasons of the "failed" upstream records.
func upstreamFailures(h *harness) []string {
	var out []string
	for _, r := range kinds(h.records(), "upstream") {
		if r.Body["event"] == "failed" {
			out = append(out, fmt.Sprint(r.Body["reason"]))
		}
	}
	return out
}

// TestToolsListIsBounded: an upstream whose tools/list never ends (a
// repeated cursor, endless cursors, endless tools, slow pages) or fails is
// not followed: after list_changed the re-list stops at the limit, the
// failure is recorded (an upstream "failed" record) and the connection is
// no longer used (the next call runs on a new one); at start the
// upstream is unavailable, recorded the same way.
func TestToolsListIsBounded(t *testing.T) {
	for _, tc := range []struct {
		paging, want string
		maxLists     int // tools/list requests one listing may cost
		shared       bool
	}{
		{"repeat", "gave a nextCursor an earlier page gave", 2, false},
		{"endless", fmt.Sprintf("still a next page after %d pages", toolprobe.MaxToolPages), toolprobe.MaxToolPages, false},
		{"many", fmt.Sprintf("more than %d tools", toolprobe.MaxTools), toolprobe.MaxTools/2000 + 1, false},
		{"slow", "did not answer within 4s (connect_timeout)", 10, false},
		{"error", "tools are being rebuilt", 1, false},
		{"repeat", "gave a nextCursor an earlier page gave", 2, true},
	} {
		name := tc.paging + " after list_changed"
		if tc.shared {
			name += " (shared)"
		}
		t.Run(name, func(t *testing.T) {
			count := filepath.Join(t.TempDir(), "lists")
			// connect_timeout is long (the limit, not the deadline, ends
			// the listing) except for the slow pages (500 ms each: the
			// listing, not one page, outlasts it; a handshake under load
			// does not).
			timeout := 30 * time.Second
			if tc.paging == "slow" {
				timeout = 4 * time.Second
			}
			h := newHarness(t, hconf{mode: "pager", shared: tc.shared, connTimeout: timeout, env: map[string]string{"CMCP_TEST_PAGING": tc.paging, "CMCP_TEST_COUNT": count}})
			cs := h.connect("", nil)
			pid := firstTextOf(t, cs, "t__pid")
			before := listsBy(count, pid)
			if _, err := call(t, cs, "t__change", nil); err != nil {
				t.Fatal(err)
			}
			eventually(t, time.Minute, func() string {
				for _, r := range upstreamFailures(h) {
					if strings.Contains(r, "after notifications/tools/list_changed") && strings.Contains(r, tc.want) {
						return ""
					}
				}
				return fmt.Sprintf("no upstream failed record naming %q: %v", tc.want, upstreamFailures(h))
			})
			// Fail closed: the connection whose tools are unknown is not
			// called again; the call runs on a new one, checked anew.
			if again := firstTextOf(t, cs, "t__pid"); again == pid {
				t.Fatalf("a call after the failed re-list ran on the same connection (pid %s)", pid)
			}
			// Once its child is gone, what the broken connection cost is
			// final: the re-list's requests, and none after it.
			old, _ := strconv.Atoi(pid)
			eventually(t, time.Minute, func() string {
				if pidAlive(old) {
					return fmt.Sprintf("the child %d of the broken connection still runs", old)
				}
				return ""
			})
			if n := listsBy(count, pid) - before; n > tc.maxLists {
				t.Fatalf("the re-list sent %d tools/list requests, want at most %d and then none", n, tc.maxLists)
			}
		})
	}
	for _, tc := range []struct{ paging, want string }{
		{"repeat", "gave a nextCursor an earlier page gave"},
		{"many", fmt.Sprintf("more than %d tools", toolprobe.MaxTools)},
	} {
		t.Run(tc.paging+" at start", func(t *testing.T) {
			// connect_timeout is long: the limit, not the deadline, ends it.
			h := newHarness(t, hconf{mode: "pager", connTimeout: 30 * time.Second, env: map[string]string{"CMCP_TEST_PAGING": tc.paging, "CMCP_TEST_PAGING_AT": "start"}})
			st := h.g.Upstreams()[0]
			if st.Available || !strings.Contains(st.Error, tc.want) {
				t.Fatalf("status %+v: want unavailable, naming %q", st, tc.want)
			}
			if f := upstreamFailures(h); len(f) != 1 || !strings.Contains(f[0], tc.want) {
				t.Fatalf("upstream failed records: %v", f)
			}
			cs := h.connect("", nil)
			if _, err := call(t, cs, "t__pid", nil); wireCode(err) != CodeUpstreamUnavailable {
				t.Fatalf("call: %v, want %d", err, CodeUpstreamUnavailable)
			}
		})
	}
}

func firstTextOf(t *testing.T, cs *mcp.ClientSession, tool string) string {
	t.Helper()
	r, err := call(t, cs, tool, nil)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return firstText(r)
}

// TestListChangedBurstIsCoalesced: 50 list_changed at once cost a re-list
// or two, not 50 concurrent ones.
func TestListChangedBurstIsCoalesced(t *testing.T) {
	count := filepath.Join(t.TempDir(), "lists")
	h := newHarness(t, hconf{mode: "pager", env: map[string]string{"CMCP_TEST_COUNT": count}})
	cs := h.connect("", nil)
	pid := firstTextOf(t, cs, "t__pid")
	before := listsBy(count, pid)
	firstTextOf(t, cs, "t__burst")
	eventually(t, time.Minute, func() string {
		if listsBy(count, pid) == before {
			return "no re-list after list_changed"
		}
		return ""
	})
	// Once the session's child is gone, what the burst cost is final.
	cs.Close()
	old, _ := strconv.Atoi(pid)
	eventually(t, time.Minute, func() string {
		if pidAlive(old) {
			return fmt.Sprintf("the session's child %d still runs", old)
		}
		return ""
	})
	if n := listsBy(count, pid) - before; n > 3 {
		t.Fatalf("50 list_changed cost %d re-lists", n)
	}
}

// TestSharedReconnectUpdatesCatalog: a shared upstream's new connection
// (after the old one failed, as after a failed re-list) is checked
// against the pins and the catalog follows it: a tool that drifted
// meanwhile is withdrawn and the agent told, not left listed.
func TestSharedReconnectUpdatesCatalog(t *testing.T) {
	h0 := newHarness(t, hconf{})
	pins := maps.Clone(h0.g.ups["t"].baseline)
	mark := filepath.Join(t.TempDir(), "started")
	h := newHarness(t, hconf{mode: "driftonrestart", shared: true, toolPins: pins, env: map[string]string{"CMCP_TEST_MARK": mark}})
	var changed atomic.Int32
	cs := h.connect("", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) }})
	if _, err := call(t, cs, "t__crash", nil); err == nil {
		t.Fatal("t__crash answered")
	}
	if _, err := call(t, cs, "t__pid", nil); err != nil { // reconnects
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() string {
		if _, ok := h.g.Catalog().Lookup("t__echo"); ok {
			return "the drifted t__echo is still in the catalog"
		}
		if changed.Load() == 0 {
			return "the agent was not sent tools/list_changed"
		}
		return ""
	})
}
