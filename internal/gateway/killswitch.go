package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/confidential-mcp/cmcp/internal/killswitch"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
)

// The kill switch outlives the process: while it is engaged its state is a
// small file in the audit directory (killswitch.StateFile), written with
// fsync and rename before the kill_switch_on record, and removed (and the
// directory synced) only after the kill_switch_off record is durable (in
// interval durability, only after a checkpoint has synced it). A
// gateway that starts and finds the file starts engaged and records a
// kill_switch_on that says it was carried over; one that finds a file it
// cannot read starts engaged too (fail closed). Only the admin API clears
// it, recorded.

// Admin record actions of the kill switch.
const (
	AdminKillSwitchOn  = "kill_switch_on"
	AdminKillSwitchOff = "kill_switch_off"
)

// KillSwitchRestartActor is the actor of the kill_switch_on record a
// gateway writes at start when it carries the switch over from before the
// restart; the record's reason says who engaged it, when and why.
const KillSwitchRestartActor = "gateway-restart"

// restoreKillSwitch engages the kill switch at start if it was engaged when
// the previous gateway on this audit directory stopped (or its state file
// cannot be read), and records that it was carried over.
func (g *Gateway) restoreKillSwitch(ctx context.Context) {
	path := g.opts.KillSwitchFile
	if path == "" {
		return
	}
	st, err := killswitch.Read(path)
	if st == nil && err == nil {
		return
	}
	g.killMu.Lock()
	defer g.killMu.Unlock()
	g.killed.Store(true)
	var reason string
	if err != nil {
		st = &killswitch.Status{Engaged: true, Since: time.Now().UTC(), Actor: KillSwitchRestartActor,
			Reason: fmt.Sprintf("the kill switch's state file cannot be read (%v): engaged to fail closed", err)}
		reason = "carried over from before the restart: " + st.Reason
		g.logger.Error("the kill switch's state file cannot be read: the kill switch is ENGAGED (fail closed) and every tools/call is refused "+
			"until an operator clears it with POST /admin/kill-switch/clear (the admin: section must be configured); check the file first",
			"file", path, "err", err)
	} else {
		reason = fmt.Sprintf("carried over from before the restart: engaged at %s by %s", st.Since.UTC().Format(time.RFC3339), st.Actor)
		if st.Reason != "" {
			reason += ": " + st.Reason
		}
		g.logger.Warn("the kill switch was engaged before the restart and stays ENGAGED: every tools/call is refused until an operator clears it "+
			"with POST /admin/kill-switch/clear", "since", st.Since, "actor", st.Actor, "reason", st.Reason, "file", path)
	}
	g.kill = *st
	if _, err := g.log.Append(context.WithoutCancel(ctx), &auditlog.Admin{Action: AdminKillSwitchOn, Actor: KillSwitchRestartActor, Reason: reason}); err != nil {
		g.logger.Error("record the carried-over kill switch (it stays engaged)", "err", err)
	}
}

// KillStatus is the kill switch's state: who engaged it, when and why.
func (g *Gateway) KillStatus() killswitch.Status {
	g.killMu.RLock()
	defer g.killMu.RUnlock()
	if !g.killed.Load() {
		return killswitch.Status{}
	}
	st := g.kill
	st.Engaged = true
	return st
}
