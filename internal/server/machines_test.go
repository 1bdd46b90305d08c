package server

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"path/filepath"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// TestMachineRefusalsRecordedAtABoundedRate: refusals of tunnel
// connectors (which anyone reaching /tunnel can cause) are recorded at most
// refusalsPerWindow per window; the next refused record counts the ones
// left out. Registrations and ends are never left out, and a registration
// with no log to record it in is an error (the hub then refuses it).
func TestMachineRefusalsRecordedAtABoundedRate(t *testing.T) {
	var r machineRecorder
	if err := r.record(tunnel.Event{Kind: tunnel.EventRegistered, Upstream: "files", MachineID: "lab-1"}); !errors.Is(err, errNoAuditLog) {
		t.Fatalf("a registration with no log: %v, want errNoAuditLog", err)
	}
	dir := filepath.Join(t.TempDir(), "audit")
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, Gateway: record.GatewayInfo{Version: "test", Platform: "software"}})
	if err != nil {
		t.Fatal(err)
	}
	r.log.Store(w)
	refuse := func() {
		if err := r.record(tunnel.Event{Kind: tunnel.EventRefused, Code: "unauthorized", Reason: "wrong token"}); err != nil {
			t.Fatal(err)
		}
	}
	for range refusalsPerWindow + 5 {
		refuse()
	}
	if err := r.record(tunnel.Event{Kind: tunnel.EventGone, Upstream: "files", MachineID: "lab-1", Reason: "killed"}); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.windowStart = r.windowStart.Add(-refusalWindow) // the next window
	r.mu.Unlock()
	refuse()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rd, err := auditlog.NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var refused, gone int
	var suppressed []int64
	for {
		e, err := rd.Next()
		if err != nil {
			break
		}
		rec, err := e.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := rec.(*record.Machine); ok {
			switch m.Event {
			case record.MachineRefused:
				refused++
				suppressed = append(suppressed, m.Suppressed)
			case record.MachineGone:
				gone++
			}
		}
	}
	if refused != refusalsPerWindow+1 || gone != 1 {
		t.Fatalf("%d refused and %d gone records, want %d and 1", refused, gone, refusalsPerWindow+1)
	}
	if last := suppressed[len(suppressed)-1]; last != 5 {
		t.Fatalf("the first refused record of the next window counts %d left out, want 5", last)
	}
}
