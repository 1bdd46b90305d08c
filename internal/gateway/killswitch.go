package gateway

import (
	"context"

	"github.com/confidential-mcp/cmcp/internal/killswitch"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
)

// The kill switch (killswitch.Switch: its state file, its records, its
// lock) as the gateway names it.

// Admin record actions of the kill switch.
const (
	AdminKillSwitchOn  = killswitch.ActionOn
	AdminKillSwitchOff = killswitch.ActionOff
)

// KillSwitchRestartActor is the actor of the kill_switch_on record a
// gateway writes at start when it carries the switch over from before the
// restart; the record's reason says who engaged it, when and why.
const KillSwitchRestartActor = killswitch.RestartActor

// KillStatus is the kill switch's state: who engaged it, when and why.
func (g *Gateway) KillStatus() killswitch.Status { return g.ks.Status() }

// killLog is the gateway's audit log as the kill switch writes to it.
type killLog struct{ g *Gateway }

func (l killLog) Append(ctx context.Context, rec record.Record) (auditlog.Receipt, error) {
	return l.g.log.Append(ctx, rec)
}

func (l killLog) Checkpoint() error { return l.g.log.Checkpoint() }
