package gateway

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readySpares waits until upstream t has n warm spares ready.
func readySpares(t *testing.T, h *harness, n int) {
	t.Helper()
	eventually(t, 30*time.Second, func() string {
		if got := h.g.SparesReady("t"); got != n {
			return fmt.Sprintf("%d warm spares ready, want %d", got, n)
		}
		return ""
	})
}

// startedPIDs are the pids of the children whose spawn records say they
// started, by the session they name ("" for none).
func startedPIDs(rs []rec) map[string][]string {
	out := map[string][]string{}
	for _, r := range kinds(rs, "spawn") {
		if r.Body["outcome"] == "started" {
			sess, _ := r.Body["session"].(string)
			out[sess] = append(out[sess], fmt.Sprint(r.Body["pid"]))
		}
	}
	return out
}

// TestWarmSparesAreHandedToOneSessionEach: with warm_spares: 2 the gateway
// starts, measures and initialises two children before any session (their
// spawn and connected records name no session). Two sessions each get one
// of them, recorded as "assigned" to that session with the child's pid,
// without a spawn of their own; no child serves two sessions; the pool is
// refilled in the background; a session's end stops its child, whose exit
// record names the session; a reload drops the ready spares (recorded) and
// makes new ones.
func TestWarmSparesAreHandedToOneSessionEach(t *testing.T) {
	h := newHarness(t, hconf{warmSpares: 2})
	readySpares(t, h, 2)
	spares := startedPIDs(h.records())[""] // the startup probe's child and the two spares

	sessions := map[string]string{} // session id -> pid of its child
	for i := range 2 {
		cs := h.connect("", nil)
		if res, err := call(t, cs, "t__echo", map[string]any{"text": fmt.Sprint(i)}); err != nil || res.IsError {
			t.Fatalf("call through a warm spare: %v %v", res, err)
		}
		if i == 0 {
			defer cs.Close()
		} else {
			cs.Close() // its child stops with it
		}
	}
	rs := h.records()
	for _, r := range kinds(rs, "upstream") {
		if r.Body["event"] == "assigned" {
			sess, _ := r.Body["session"].(string)
			pid := strings.TrimPrefix(fmt.Sprint(r.Body["endpoint"]), "pid ")
			if _, twice := sessions[sess]; twice {
				t.Fatalf("session %s was assigned two spares", sess)
			}
			for s, p := range sessions {
				if p == pid {
					t.Fatalf("child %s was handed to sessions %s and %s", pid, s, sess)
				}
			}
			sessions[sess] = pid
		}
	}
	if len(sessions) != 2 {
		t.Fatalf("%d sessions were assigned a spare, want 2: %v", len(sessions), kinds(rs, "upstream"))
	}
	started := startedPIDs(rs)
	for sess, pid := range sessions {
		if len(started[sess]) != 0 {
			t.Fatalf("session %s spawned its own child %v although it got spare %s", sess, started[sess], pid)
		}
		found := false
		for _, p := range spares {
			found = found || p == pid
		}
		if !found {
			t.Fatalf("session %s was assigned pid %s, not one of the children started before it (%v)", sess, pid, spares)
		}
	}
	for _, c := range kinds(rs, "call") {
		if _, ok := sessions[fmt.Sprint(c.Body["session"])]; !ok {
			t.Fatalf("a call of session %v, which no spare was assigned to", c.Body["session"])
		}
	}

	readySpares(t, h, 2) // refilled
	// The closed session's child exited, its exit record naming it.
	eventually(t, 20*time.Second, func() string {
		for _, r := range kinds(h.records(), "spawn") {
			if r.Body["outcome"] == "exited" && sessions[fmt.Sprint(r.Body["session"])] == fmt.Sprint(r.Body["pid"]) {
				return ""
			}
		}
		return "no exit record of a spare's child names the session it served"
	})

	// A reload drops the ready spares and makes new ones.
	before := startedPIDs(h.records())[""]
	h.g.DrainSpares("configuration reloaded (SIGHUP)")
	readySpares(t, h, 2)
	eventually(t, 20*time.Second, func() string {
		dropped := 0
		for _, r := range kinds(h.records(), "upstream") {
			if r.Body["event"] == "disconnected" && r.Body["session"] == nil && r.Body["reason"] == "configuration reloaded (SIGHUP)" {
				dropped++
			}
		}
		if dropped != 2 {
			return fmt.Sprintf("%d spares recorded as dropped by the reload, want 2", dropped)
		}
		return ""
	})
	if after := startedPIDs(h.records())[""]; len(after) != len(before)+2 {
		t.Fatalf("%d children started without a session after the reload, want %d", len(after), len(before)+2)
	}
}

// TestWarmSpareOfAChangedFileIsNotHandedOut: a spare whose command file is
// replaced on disk after it was measured is dropped, recorded with the
// reason, instead of handed to a session; the session's own connection
// measures the file again and is refused under the pin (-32062).
func TestWarmSpareOfAChangedFileIsNotHandedOut(t *testing.T) {
	exe, _ := selfDigest(t)
	p := filepath.Join(t.TempDir(), "server")
	copyExe(t, exe, p)
	h := newHarness(t, hconf{warmSpares: 1, command: p})
	readySpares(t, h, 1)

	tampered := p + ".new"
	copyExe(t, exe, tampered)
	f, err := os.OpenFile(tampered, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("TAMPERED"))
	f.Close()
	if err := os.Rename(tampered, p); err != nil {
		t.Fatal(err)
	}
	cs := h.connect("", nil)
	_, err = call(t, cs, "t__echo", map[string]any{"text": "x"})
	if wireCode(err) != CodeUpstreamUnavailable {
		t.Fatalf("call after the file changed: %v, want refused (%d)", err, CodeUpstreamUnavailable)
	}
	rs := h.records()
	for _, r := range kinds(rs, "upstream") {
		if r.Body["event"] == "assigned" {
			t.Fatalf("a spare of the changed file was handed out: %v", r.Body)
		}
	}
	dropped := false
	for _, r := range kinds(rs, "upstream") {
		dropped = dropped || (r.Body["event"] == "disconnected" && strings.Contains(fmt.Sprint(r.Body["reason"]), p+" changed on disk"))
	}
	refused := false
	for _, r := range kinds(rs, "spawn") {
		refused = refused || (r.Body["outcome"] == "refused" && strings.Contains(fmt.Sprint(r.Body["reason"]), "but the pin is"))
	}
	if !dropped || !refused {
		t.Fatalf("spare dropped %v (want a disconnected record naming the change), new spawn refused %v", dropped, refused)
	}
}

func copyExe(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestWarmSparesCountInTheSessionBound: open sessions and spares together
// stay within server.max_sessions: with a bound of 2 and warm_spares: 2, a
// session that took a spare leaves room for one spare only, and the pool
// fills up again once the session ends.
func TestWarmSparesCountInTheSessionBound(t *testing.T) {
	h := newHarness(t, hconf{warmSpares: 2, maxSessions: 2})
	readySpares(t, h, 2)
	cs := h.connect("", nil)
	if _, err := call(t, cs, "t__echo", map[string]any{"text": "x"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a refill past the bound would have started
	if got := h.g.SparesReady("t"); got != 1 {
		t.Fatalf("%d spares ready beside 1 open session, bound 2: want 1", got)
	}
	if n := h.g.spareCount.Load(); n != 1 {
		t.Fatalf("%d spares counted, want 1", n)
	}
	cs.Close()
	readySpares(t, h, 2)
}
