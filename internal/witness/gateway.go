package witness

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/c2sp"
)

// Gateway is what a gateway needs of its log identity and witnesses
// (audit.log, audit.witnesses): the writer option, the client, and the
// readiness and metrics views of it.
type Gateway struct {
	// Identity is the auditlog.Options.Log to open the writer with.
	Identity *auditlog.LogIdentity
	// Client submits to the witnesses (nil without audit.witnesses).
	Client *Client
}

// NewGateway prepares a gateway's log identity (origin, and the log key
// loaded from keyFile or created there at the first start: audit.log) and
// its witness client (audit.witnesses; none: no client).
func NewGateway(origin, keyFile string, witnesses []Witness, auditDir string, logger *slog.Logger) (*Gateway, error) {
	key, err := c2sp.LoadOrCreateLogKey(keyFile, origin)
	if err != nil {
		return nil, fmt.Errorf("audit.log: %w", err)
	}
	g := &Gateway{Identity: &auditlog.LogIdentity{Origin: origin, Key: key}}
	if len(witnesses) == 0 {
		return g, nil
	}
	_, vkey, err := c2sp.NewNoteKeys(origin, key)
	if err != nil {
		return nil, err
	}
	cfg := Config{LogKey: vkey, AuditDir: auditDir, Logger: logger, Witnesses: witnesses}
	if g.Client, err = New(cfg); err != nil {
		return nil, err
	}
	g.Identity.OnCheckpoint = g.Client.Submit
	return g, nil
}

// Attach starts the submissions for the writer's epoch.
func (g *Gateway) Attach(w *auditlog.Writer) error {
	if g == nil || g.Client == nil {
		return nil
	}
	base, fr := w.LogBase()
	_, dir := w.Epoch()
	return g.Client.Attach(dir, base, fr)
}

// Close waits (at most wait) for the witnesses to cosign the final
// checkpoint, after the writer is closed.
func (g *Gateway) Close(wait time.Duration) error {
	if g == nil || g.Client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return g.Client.Close(ctx)
}

// Ready is nil while every witness cosigns; otherwise it names the
// witnesses that do not (down, refused, or in conflict with this log) and
// why, for /readyz.
func (g *Gateway) Ready() error {
	if g == nil || g.Client == nil {
		return nil
	}
	var bad []string
	for _, s := range g.Client.Status() {
		if s.State == StateOK || s.State == StateStarting {
			continue
		}
		bad = append(bad, fmt.Sprintf("witness %s %s (%d failures): %s", s.Name, s.State, s.Failures, s.Error))
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(bad, "; "))
}

// Registry is the part of the gateway's metrics the witnesses use.
type Registry interface {
	GaugeFunc(name, help string, f func() float64)
	CounterFunc(name, help string, f func() float64)
}

// RegisterMetrics adds the witness metrics (no labels: aggregates).
func (g *Gateway) RegisterMetrics(m Registry) {
	if g == nil || g.Client == nil || m == nil {
		return
	}
	sum := func(f func(Status) float64) func() float64 {
		return func() float64 {
			var n float64
			for _, s := range g.Client.Status() {
				n += f(s)
			}
			return n
		}
	}
	m.GaugeFunc("cmcp_witnesses_configured", "Witnesses in audit.witnesses.", sum(func(Status) float64 { return 1 }))
	m.GaugeFunc("cmcp_witnesses_cosigning", "Witnesses whose last submission was cosigned.", sum(func(s Status) float64 {
		if s.State == StateOK {
			return 1
		}
		return 0
	}))
	m.GaugeFunc("cmcp_witnesses_conflict", "Witnesses that hold a tree this log does not extend (fork or rollback): a security alarm.", sum(func(s Status) float64 {
		if s.State == StateConflict {
			return 1
		}
		return 0
	}))
	m.GaugeFunc("cmcp_witness_lag_entries", "Log entries the least advanced witness has not cosigned yet.", func() float64 {
		var lag int64
		for _, s := range g.Client.Status() {
			lag = max(lag, s.Pending-s.Size)
		}
		return float64(lag)
	})
	m.CounterFunc("cmcp_witness_submissions_total", "add-checkpoint requests sent to witnesses.", sum(func(s Status) float64 { return float64(s.Submissions) }))
	m.CounterFunc("cmcp_witness_errors_total", "add-checkpoint submissions that failed.", sum(func(s Status) float64 { return float64(s.Errors) }))
}

// WaitCosigned waits at most d for the witnesses to cosign the newest
// checkpoint (Client.WaitCosigned).
func (g *Gateway) WaitCosigned(d time.Duration) bool {
	if g == nil || g.Client == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return g.Client.WaitCosigned(ctx)
}
