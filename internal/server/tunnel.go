package server

import (
	"context"
	"crypto/ed25519"
	"fmt"

	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/tunnel"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// tunnelHub builds the hub of the configuration's tunnel upstreams (nil if
// there are none) and their upstream.Tunnel, by name. A connector that asks
// for evidence gets the gateway's, bound to the audit key, its nonce and
// the TLS channel it is on; a machine is admitted once its server
// publishes the same tools as the upstream's first machine.
func (s *serve) tunnelHub() (*tunnel.Hub, map[string]*upstream.Tunnel, error) {
	var specs []tunnel.Upstream
	for _, u := range s.cfg.Upstreams {
		if u.Tunnel == nil {
			continue
		}
		spec := tunnel.Upstream{Name: u.Name, MaxMachines: u.Tunnel.MaxMachines}
		for _, t := range u.Tunnel.Tokens {
			spec.Tokens = append(spec.Tokens, tunnel.Token{SHA256: t.SHA256, Machines: t.Machines})
		}
		specs = append(specs, spec)
	}
	if len(specs) == 0 {
		return nil, nil, nil
	}
	tuns := map[string]*upstream.Tunnel{}
	s.machines.logger = s.logger
	hub, err := tunnel.New(tunnel.Options{
		Upstreams: specs,
		Log:       s.logger,
		Event:     s.machines.record,
		Attest: func(ctx context.Context, nonce []byte, st digest.Digest) ([]byte, error) {
			if s.prov == nil || s.key == nil {
				return nil, fmt.Errorf("the gateway's attestation is not ready yet")
			}
			b, err := s.prov.Attest(ctx, s.key.Public().(ed25519.PublicKey), nonce, st)
			if err != nil {
				return nil, err
			}
			return b.Marshal()
		},
		Admit: func(ctx context.Context, m *tunnel.Machine) error {
			t := tuns[m.Upstream]
			if t == nil {
				return fmt.Errorf("no tunnel upstream %q", m.Upstream)
			}
			return t.Admit(ctx, m)
		},
	})
	if err != nil {
		return nil, nil, err
	}
	if m := s.o.Metrics; m != nil {
		m.GaugeFunc("cmcp_tunnel_machines", "Machines registered through tunnels and admitted, over every tunnel upstream.", func() float64 {
			n := 0
			for _, sp := range specs {
				n += len(hub.Machines(sp.Name))
			}
			return float64(n)
		})
		m.CounterFunc("cmcp_tunnel_frames_dropped_total", "Tunnel frames for sessions the gateway does not have, dropped.", func() float64 { return float64(hub.Dropped.Load()) })
	}
	for _, sp := range specs {
		t := upstream.NewTunnel(sp.Name, hub)
		t.Log = s.logger
		tuns[sp.Name] = t
	}
	return hub, tuns, nil
}

// watchTunnels loads a tunnel upstream's catalog through its machines as
// they come (a gateway starts before any machine dialled in), until Serve
// returns.
func (s *serve) watchTunnels(g *gateway.Gateway) {
	if s.hub == nil {
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	s.onReturn(func() { cancel(); s.hub.Close() })
	go func() {
		for {
			ch := s.hub.Changed()
			for _, u := range s.cfg.Upstreams {
				if u.Tunnel != nil && len(s.hub.Machines(u.Name)) > 0 {
					if err := g.LoadUpstream(ctx, u.Name); err != nil && ctx.Err() == nil {
						s.logger.Warn("tunnel upstream: loading its tools through a machine failed", "upstream", u.Name, "err", err)
					}
				}
			}
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
	}()
}
