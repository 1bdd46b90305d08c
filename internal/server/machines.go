package server

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// refusalsPerWindow bounds the refused records of one refusalWindow:
// whoever can reach the tunnel endpoint can be refused as often as they
// like, and must not fill the audit log doing it. The refusals over the
// bound are counted into the next refused record (suppressed).
const (
	refusalsPerWindow = 20
	refusalWindow     = 10 * time.Second
)

// machineRecorder writes the hub's machine events (tunnel.Event) to the
// audit log as machine records. The log opens after the hub is built;
// until then (no connector can reach the hub before the listener serves)
// a registration is refused.
type machineRecorder struct {
	log    atomic.Pointer[auditlog.Writer]
	logger *slog.Logger

	// registered, refused and gone count the events (metrics), recorded
	// or not.
	registered, refused, gone atomic.Int64

	mu          sync.Mutex
	windowStart time.Time
	inWindow    int
	suppressed  int64
}

var errNoAuditLog = errors.New("the audit log is not open yet")

// record writes ev; it returns the append's error (a registration that
// cannot be recorded is refused).
func (r *machineRecorder) record(ev tunnel.Event) error {
	switch ev.Kind {
	case tunnel.EventRefused:
		r.refused.Add(1)
	case tunnel.EventGone:
		r.gone.Add(1)
	}
	w := r.log.Load()
	if w == nil {
		return errNoAuditLog
	}
	rec := &record.Machine{Upstream: ev.Upstream, Machine: ev.MachineID, Name: ev.Name, Remote: ev.Remote, Version: ev.Version,
		TokenID: ev.TokenID, Attested: ev.Attested, Code: ev.Code, Reason: ev.Reason}
	switch ev.Kind {
	case tunnel.EventRegistered:
		rec.Event = record.MachineRegistered
	case tunnel.EventRefused:
		rec.Event = record.MachineRefused
		if !r.admitRefusal(rec) {
			return nil
		}
	case tunnel.EventGone:
		rec.Event = record.MachineGone
		rec.ConnectedMS = ev.Connected.Milliseconds()
	default:
		return nil
	}
	if ev.Server.Kind != "" {
		rec.Class = upstream.ClassTunnel
		rec.Server = &record.MachineServer{Kind: ev.Server.Kind, Command: ev.Server.Command, Pin: ev.Server.Pin, Digest: ev.Server.Digest, Class: ev.Server.Class}
		h := ev.Host
		if h.Hostname != "" || h.OS != "" || h.Arch != "" || h.CPUs != 0 {
			rec.Host = &record.MachineHost{Hostname: h.Hostname, OS: h.OS, Arch: h.Arch, CPUs: int64(h.CPUs)}
		}
	}
	if _, err := w.Append(context.Background(), rec); err != nil {
		if r.logger != nil {
			r.logger.Error("audit append failed for a tunnel machine event", "event", rec.Event, "upstream", rec.Upstream, "machine", rec.Machine, "err", err)
		}
		return err
	}
	if ev.Kind == tunnel.EventRegistered {
		r.registered.Add(1)
	}
	return nil
}

// admitRefusal reports whether a refused record may be written now, and
// sets its count of the refusals left unrecorded before it.
func (r *machineRecorder) admitRefusal(rec *record.Machine) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if now.Sub(r.windowStart) >= refusalWindow {
		r.windowStart, r.inWindow = now, 0
	}
	if r.inWindow >= refusalsPerWindow {
		r.suppressed++
		if r.suppressed == 1 && r.logger != nil {
			r.logger.Warn("tunnel: refusals over the recording bound; the next refused record counts the ones not recorded", "bound", refusalsPerWindow, "window", refusalWindow)
		}
		return false
	}
	r.inWindow++
	rec.Suppressed, r.suppressed = r.suppressed, 0
	return true
}
