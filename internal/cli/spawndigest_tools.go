package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/confidential-mcp/cmcp/internal/catalog"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/measure"
	"github.com/confidential-mcp/cmcp/internal/toolprobe"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

// toolPins spawns the server just measured in r (executing exactly the
// measured bytes), lists its tools and returns their definition pins.
// namespaced is the printed entry's namespace: setting: the tool names are
// checked as the gateway will expose them.
func toolPins(ctx context.Context, e *env, name string, r *measure.Result, namespaced bool) ([]toolprobe.ToolPin, error) {
	spec := upstream.StdioSpec{Name: name, Command: r.Resolved, Args: r.Args, Pin: r.CommandDigest, StopGrace: 2 * time.Second}
	if t := r.Target; t != nil {
		spec.MeasurePath, spec.MeasurePin = t.Path, t.Digest
	}
	if sc := r.Script; sc != nil {
		spec.InterpreterPin = sc.Digest
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	// With namespace: true (the default) tools are exposed as
	// "<name>__<tool>", which the gateway checks; with false, as named.
	pins, err := toolprobe.ProbeTools(ctx, spec, namespaced, e.environ, e.stderr)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, exitcode.Errorf(exitcode.ExitRuntime, "list the tools of %s: it did not answer initialize and tools/list within %s, and was stopped", r.Resolved, probeTimeout).
				Hint("the server must speak MCP on stdin/stdout; check that it starts with these arguments (its stderr, if any, is above)")
		}
		var se *upstream.SpawnError
		if errors.As(err, &se) && errors.Is(err, upstream.ErrPinMismatch) && se.Hint != "" {
			// Refused for what it measured (a --target the server
			// wrote into, say): the refusal says what to do.
			return nil, exitcode.Errorf(exitcode.ExitRuntime, "list the tools of %s: upstream %q unavailable: %s", r.Resolved, se.Upstream, se.Reason).Hint("%s", se.Hint)
		}
		return nil, exitcode.Errorf(exitcode.ExitRuntime, "list the tools of %s: %w", r.Resolved, err).
			Hint("the server must speak MCP on stdin/stdout; check that it starts with these arguments (its stderr, if any, is above)")
	}
	if namespaced {
		// A name refused only for its "<name>__" prefix is accepted by a
		// gateway whose single upstream has namespace: false: say so.
		for i, p := range pins {
			if p.Error == "" {
				continue
			}
			if _, err := catalog.Exposed(name, p.Name, true); err == nil || err.Error() != p.Error {
				continue // refused for another reason
			}
			if _, err := catalog.Exposed(name, p.Name, false); err == nil {
				pins[i].Error += "; with namespace: false (a single upstream) it is exposed as named: spawn-digest --namespace=false pins it"
			}
		}
	}
	return pins, nil
}

// probeTimeout bounds how long --tools waits for the server to start and
// list its tools.
const probeTimeout = 60 * time.Second

// toolsYAML renders pins as a catalog: section to paste into cmcp.yaml.
// The tool names are the server's: quoted as keys, and in the comment
// naming a refused tool (measure.CommentText), never written raw. When no tool is
// pinned (the server lists none, or the gateway would refuse each) the
// entry is "tools: {}", which refuses every tool: "tools:" with nothing
// after it is refused at load.
func toolsYAML(name string, pins []toolprobe.ToolPin) string {
	var b strings.Builder
	tools := "tools: {}  # no tool pinned: every tool is refused"
	if slices.ContainsFunc(pins, func(p toolprobe.ToolPin) bool { return p.Error == "" }) {
		tools = "tools:"
	}
	fmt.Fprintf(&b, "catalog:\n  upstreams:\n    %s:\n      %s\n", measure.YAMLQuote(name), tools)
	for _, p := range pins {
		if p.Error != "" {
			fmt.Fprintf(&b, "        # %s: refused by the gateway: %s\n", measure.CommentText(p.Name), measure.CommentText(p.Error))
			continue
		}
		fmt.Fprintf(&b, "        %s: %s\n", measure.YAMLQuote(p.Name), p.Pin)
	}
	return b.String()
}

// toolsFlow renders pins as a one-line YAML mapping.
func toolsFlow(pins []toolprobe.ToolPin) string {
	var parts []string
	for _, p := range pins {
		if p.Error == "" {
			parts = append(parts, fmt.Sprintf("%s: %s", measure.YAMLQuote(p.Name), p.Pin))
		}
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
