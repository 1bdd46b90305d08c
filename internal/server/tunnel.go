package server

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

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
		m.CounterFunc("cmcp_tunnel_registrations_total", "Machines admitted through tunnels (each recorded in the audit log).", func() float64 { return float64(s.machines.registered.Load()) })
		m.CounterFunc("cmcp_tunnel_refusals_total", "Tunnel registrations refused (wrong token, duplicate machine id, other tools, full, bad frames).", func() float64 { return float64(s.machines.refused.Load()) })
		m.CounterFunc("cmcp_tunnel_machines_gone_total", "Registered machines whose tunnel ended (closed, half-open, stalled, gateway stopping).", func() float64 { return float64(s.machines.gone.Load()) })
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

// tunnelUpstreams names the configuration's tunnel upstreams, in order.
func (s *serve) tunnelUpstreams() []string {
	var names []string
	for _, u := range s.cfg.Upstreams {
		if u.Tunnel != nil {
			names = append(names, u.Name)
		}
	}
	return names
}

// tunnelNotes are /readyz's lines (to the admin token) about the tunnel
// upstreams: their live machines, or that none is connected (its calls
// are refused until one registers; the gateway stays ready, for its
// machines to dial in).
func (s *serve) tunnelNotes() []string {
	if s.hub == nil {
		return nil
	}
	var notes []string
	for _, name := range s.tunnelUpstreams() {
		ms := s.hub.Machines(name)
		if len(ms) == 0 {
			notes = append(notes, fmt.Sprintf("tunnel upstream %s: no machine connected; its calls are refused until `cmcp connect` registers one", name))
			continue
		}
		ids := make([]string, len(ms))
		for i, m := range ms {
			ids[i] = m.ID
		}
		what := "machines"
		if len(ms) == 1 {
			what = "machine"
		}
		notes = append(notes, fmt.Sprintf("tunnel upstream %s: %d %s connected (%s)", name, len(ms), what, strings.Join(ids, ", ")))
	}
	return notes
}

// TunnelStatus is GET /admin/machines's answer: every tunnel upstream and
// its live machines.
type TunnelStatus struct {
	Upstreams []TunnelUpstreamStatus `json:"upstreams"`
}

// TunnelUpstreamStatus is one tunnel upstream on /admin/machines.
type TunnelUpstreamStatus struct {
	Name     string        `json:"name"`
	Machines []tunnel.Info `json:"machines"`
}

// tunnelRoutes are the admin endpoints of the tunnels: GET /admin/machines.
func (s *serve) tunnelRoutes() map[string]http.Handler {
	if s.hub == nil {
		return nil
	}
	return map[string]http.Handler{"GET /admin/machines": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		st := TunnelStatus{Upstreams: []TunnelUpstreamStatus{}}
		for _, name := range s.tunnelUpstreams() {
			u := TunnelUpstreamStatus{Name: name, Machines: []tunnel.Info{}}
			for _, m := range s.hub.Machines(name) {
				u.Machines = append(u.Machines, m.Info())
			}
			st.Upstreams = append(st.Upstreams, u)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
	})}
}
