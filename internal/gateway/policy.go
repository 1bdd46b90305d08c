package gateway

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/confidential-mcp/cmcp/internal/decide"
	"github.com/confidential-mcp/cmcp/internal/machines"
	"github.com/confidential-mcp/cmcp/internal/policy"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// The gateway's side of the policy stage (internal/decide): its decision
// seam under the gateway's names, the Cedar decider's view of the
// catalog, the access gate's view of the gateway and the session, and
// the policy bundle's records and reload.

// The decision seam (internal/decide), under the names of the gateway's
// Options.
type (
	Decider         = decide.Decider
	Decision        = decide.Decision
	DecisionRequest = decide.DecisionRequest
	ListFilter      = decide.ListFilter
	SessionInfo     = decide.SessionInfo
	AllowAll        = decide.AllowAll
)

// Policy modes a Decision can carry (internal/decide).
const (
	ModeNone      = decide.ModeNone
	ModeEnforcing = decide.ModeEnforcing
	ModeAdvisory  = decide.ModeAdvisory
	ModeSilent    = decide.ModeSilent
)

// policyTools is the catalog as the Cedar decider's list filter sees it
// (decide.Cedar.Tools): read once per tools/list.
func (g *Gateway) policyTools() func(string) (decide.Tool, bool) {
	cat := g.Catalog()
	return func(name string) (decide.Tool, bool) {
		if st, _ := g.listMachinesOf(name); st != nil {
			return decide.Tool{Upstream: st.name, Name: machines.Tool, EvidenceClass: upstream.ClassTunnel}, true
		}
		e, ok := cat.Lookup(name)
		if !ok {
			return decide.Tool{}, false
		}
		class := ""
		if st := g.ups[e.Upstream]; st != nil {
			class = st.expectedClass()
		}
		return decide.Tool{Upstream: e.Upstream, Name: e.Name, EvidenceClass: class}, true
	}
}

// gate is the access gate of s's resource, prompt and completion
// requests (decide.Gate).
func (s *session) gate() decide.Gate {
	return decide.Gate{Policy: s.g.opts.Policy, Core: gateCore{s.g}, Session: gateSession{s}}
}

// gateCore is the gateway as the access gate sees it (decide.GateCore).
type gateCore struct{ g *Gateway }

func (c gateCore) Class(up string) (string, bool) {
	st := c.g.ups[up]
	if st == nil {
		return "", false
	}
	return st.expectedClass(), true
}

func (c gateCore) Commit(b []byte) record.Commitment { return c.g.log.Commit(b) }
func (c gateCore) Closing() bool                     { return c.g.closing.Load() }
func (c gateCore) Killed() bool                      { return c.g.ks.Engaged() }
func (c gateCore) Logger() *slog.Logger              { return c.g.logger }

func (c gateCore) Record(ctx context.Context, rec record.Record) error { return c.g.record(ctx, rec) }

func (c gateCore) AppendForwarded(ctx context.Context, rec record.Record) (bool, error) {
	c.g.ks.RLock()
	defer c.g.ks.RUnlock()
	if c.g.ks.Engaged() {
		return true, nil
	}
	_, err := c.g.log.Append(context.WithoutCancel(ctx), rec)
	return false, err
}

func (c gateCore) Decided(decision, mode string) {
	if m := c.g.opts.Metrics; m != nil {
		m.Decision(decision, mode)
	}
}

// gateSession is a session as the access gate sees it (decide.GateSession).
type gateSession struct{ s *session }

func (g gateSession) ID() string        { return g.s.id }
func (g gateSession) Principal() string { return g.s.principal }
func (g gateSession) Groups() []string  { return g.s.credGroups() }

func (g gateSession) Warn(ctx context.Context, msg string, d Decision, data map[string]any) {
	g.s.warnAgent(ctx, msg, d, data)
}

// PolicyEngine is the policy engine in force, or nil.
func (g *Gateway) PolicyEngine() *policy.Engine { return g.opts.Policy }

// recordPolicyLoaded writes the policy record of the bundle in force at start.
func (g *Gateway) recordPolicyLoaded(ctx context.Context) {
	eng := g.opts.Policy
	if eng == nil {
		return
	}
	b := eng.Bundle()
	g.record(ctx, &record.Policy{Event: "loaded", Bundle: b.Digest(), Mode: string(eng.Mode()), Path: b.Dir(), Policies: int64(len(b.PolicyIDs()))})
}

// ReloadPolicy replaces the policy bundle (SIGHUP): only if the bundle in
// dir loads, validates and, when expect is set, matches it. The switch is
// recorded with both digests; a refused reload is recorded with the reason
// and the old bundle stays in force.
func (g *Gateway) ReloadPolicy(ctx context.Context, dir string, expect digest.Digest, mode policy.Mode, groups map[string][]string) error {
	eng := g.opts.Policy
	if eng == nil {
		return fmt.Errorf("no policy is configured: a policy section can only be added with a restart (the genesis record names the policy)")
	}
	sw, err := eng.Reload(ctx, dir, expect, mode, groups)
	if err != nil {
		g.record(ctx, &record.Policy{Event: "rejected", Previous: sw.Old, Mode: string(sw.Mode), Path: dir, Reason: err.Error()})
		g.logger.Error("policy reload refused; the old bundle stays in force", "bundle", sw.Old.String(), "err", err)
		return err
	}
	if rerr := g.record(ctx, &record.Policy{Event: "reloaded", Bundle: sw.New, Previous: sw.Old, Mode: string(sw.Mode), Path: dir, Policies: int64(sw.Policies)}); rerr != nil {
		return fmt.Errorf("policy bundle %s is in force but its switch could not be recorded: %w", sw.New, rerr)
	}
	g.logger.Info("policy reloaded", "from", sw.Old.String(), "to", sw.New.String(), "mode", string(sw.Mode), "policies", sw.Policies)
	// The new bundle may show each agent other lists (list_tools,
	// read_resource, get_prompt): tell every connected agent to list its
	// tools, resources and prompts again.
	g.mu.Lock()
	caps := g.caps
	g.mu.Unlock()
	sessions := g.sessionList()
	for _, s := range sessions {
		s.notifyToolsChanged()
		if caps != nil && caps.Resources != nil && caps.Resources.ListChanged {
			s.notifyListChanged("resources")
		}
		if caps != nil && caps.Prompts != nil && caps.Prompts.ListChanged {
			s.notifyListChanged("prompts")
		}
	}
	return nil
}

// RejectPolicyReload records and logs a refused policy reload.
func (g *Gateway) RejectPolicyReload(ctx context.Context, err error) error {
	eng := g.opts.Policy
	g.record(ctx, &record.Policy{Event: "rejected", Previous: eng.Bundle().Digest(), Mode: string(eng.Mode()), Reason: err.Error()})
	g.logger.Error("policy reload refused; the old bundle stays in force", "bundle", eng.Bundle().Digest().String(), "err", err)
	return err
}
