// Package toolprobe talks to an upstream within bounds before the gateway
// trusts it: ListTools lists its tools (pages, count and time bounded),
// ConnectWithin gives up on a handshake that takes too long, and
// ProbeTools spawns a stdio server once to pin its tools for
// `cmcp spawn-digest --tools`.
package toolprobe

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/upstream"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// ToolPin is one tool's definition pin, as `cmcp spawn-digest --tools`
// prints it.
type ToolPin struct {
	Name  string        `json:"name"`
	Pin   digest.Digest `json:"pin,omitzero"`
	Error string        `json:"error,omitempty"` // why the tool would be refused
}

// ProbeTools spawns the stdio server described by spec (measured like the
// gateway does: spec.Pin must be the digest just measured), lists its tools
// and returns their definition pins sorted by name. Tools the gateway would
// refuse (an input schema that is not an object, a duplicate name, an
// exposed name that is not 1-64 characters of [A-Za-z0-9_-]) carry an
// Error and no pin. The exposed name is "<spec.Name>__<tool>" when
// namespaced (an upstream's default), else the tool's own name.
//
// The server's stderr goes to stderr (nil: dropped), so that a server that
// will not start says why.
func ProbeTools(ctx context.Context, spec upstream.StdioSpec, namespaced bool, environ []string, stderr io.Writer) ([]ToolPin, error) {
	var hooks upstream.Hooks
	if stderr != nil {
		hooks.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	s := &upstream.Stdio{Spec: spec, Environ: environ, Share: "per-session", Hooks: hooks}
	client := mcp.NewClient(&mcp.Implementation{Name: "cmcp-spawn-digest", Version: "1"}, nil)
	conn, err := s.Connect(ctx, client, upstream.ConnectOptions{})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// Bounded like the gateway's own listing: what the gateway would
	// refuse is not pinned.
	tools, err := ListTools(ctx, conn.Session, 0)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", spec.Name, err)
	}
	accepted, digests, drift := catalog.Check(spec.Name, tools, nil, false)
	var out []ToolPin
	for _, t := range accepted {
		// The check Catalog.Add makes: a tool it would refuse is not pinned.
		if _, err := catalog.Exposed(spec.Name, t.Name, namespaced); err != nil {
			out = append(out, ToolPin{Name: t.Name, Error: err.Error()})
			continue
		}
		out = append(out, ToolPin{Name: t.Name, Pin: digests[t.Name]})
	}
	for _, d := range drift {
		if d.Kind == catalog.DriftInvalid {
			out = append(out, ToolPin{Name: d.Tool, Error: d.Detail})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
