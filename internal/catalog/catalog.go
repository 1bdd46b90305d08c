// Package catalog is the set of tools the gateway exposes: the tools of every
// approved upstream under "<upstream>__<tool>" (or bare names for a single
// upstream with namespacing off), with names that every major client accepts,
// no collisions, and each tool's definition pinned by the digest of its
// canonical JSON so that a changed, added or removed tool (a "rug pull") is
// detected when an upstream session starts and on every list_changed.
package catalog

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Separator joins an upstream name and a tool name.
const Separator = "__"

// nameRE is checked with the length apart (validName): a counted
// repetition compiles to one instruction per count, kept in the heap
// from package initialisation on.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// validName reports whether name is 1-64 characters of [A-Za-z0-9_-].
func validName(name string) bool { return len(name) <= 64 && nameRE.MatchString(name) }

// CheckUpstreamName returns an error unless name can prefix tool names: 1-64
// characters of [A-Za-z0-9_-] without "__" (so that exposed names split
// unambiguously).
func CheckUpstreamName(name string) error {
	if !validName(name) {
		return fmt.Errorf("upstream name %q must be 1-64 characters of A-Z, a-z, 0-9, '_' and '-'", name)
	}
	if strings.Contains(name, Separator) {
		return fmt.Errorf("upstream name %q must not contain %q (it separates upstream and tool in exposed names)", name, Separator)
	}
	return nil
}

// Exposed returns the name under which upstream's tool is shown to agents.
func Exposed(upstream, tool string, namespaced bool) (string, error) {
	name := tool
	if namespaced {
		name = upstream + Separator + tool
	}
	if !validName(name) {
		return "", fmt.Errorf("tool %q of upstream %q would be exposed as %q, which is not 1-64 characters of A-Z, a-z, 0-9, '_' and '-'", tool, upstream, name)
	}
	return name, nil
}

// SplitExposed splits a namespaced exposed name into upstream and tool.
func SplitExposed(name string) (upstream, tool string, ok bool) {
	return strings.Cut(name, Separator)
}

// pinned is what a pin covers: every field of a tool definition that
// agents are shown (mcp.Tool has no other; the gateway exposes a copy of
// it, renamed). _meta and icons are left out of the canonical form when
// absent or empty, so the pins of tools without them are what they were
// before they were covered.
type pinned struct {
	Name         string               `json:"name"`
	Title        string               `json:"title,omitempty"`
	Description  string               `json:"description,omitempty"`
	InputSchema  any                  `json:"inputSchema,omitempty"`
	OutputSchema any                  `json:"outputSchema,omitempty"`
	Annotations  *mcp.ToolAnnotations `json:"annotations,omitempty"`
	// Meta and Icons reach agents too: an upstream that changes a tool's
	// _meta (an MCP Apps ui/resourceUri, say) or its icon URLs changes
	// what the agent's client does with the tool.
	Meta  map[string]any `json:"_meta,omitempty"`
	Icons []mcp.Icon     `json:"icons,omitempty"`
}

// Pin returns the digest of the canonical JSON (RFC 8785) of the tool's name,
// title, description, input and output schemas, annotations, _meta and
// icons, as the upstream defines it (its own name, not the exposed one).
func Pin(t *mcp.Tool) (digest.Digest, error) {
	b, err := json.Marshal(pinned{Name: t.Name, Title: t.Title, Description: t.Description, InputSchema: t.InputSchema, OutputSchema: t.OutputSchema,
		Annotations: t.Annotations, Meta: t.Meta, Icons: t.Icons})
	if err != nil {
		return digest.Digest{}, fmt.Errorf("tool %q: encode definition: %w", t.Name, err)
	}
	d, err := digest.JSON(b)
	if err != nil {
		return digest.Digest{}, fmt.Errorf("tool %q: canonical definition: %w", t.Name, err)
	}
	return d, nil
}

// CheckSchema returns an error unless the tool's input schema is a JSON
// object schema ("type": "object"), as MCP requires.
func CheckSchema(t *mcp.Tool) error {
	if t.InputSchema == nil {
		return fmt.Errorf("tool %q has no inputSchema", t.Name)
	}
	b, err := json.Marshal(t.InputSchema)
	if err != nil {
		return fmt.Errorf("tool %q: inputSchema: %w", t.Name, err)
	}
	var s struct {
		Type any `json:"type"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("tool %q: inputSchema is not a JSON object", t.Name)
	}
	if s.Type != "object" {
		return fmt.Errorf("tool %q: inputSchema type is %v, want \"object\"", t.Name, s.Type)
	}
	return nil
}

// Drift kinds.
const (
	DriftChanged = "changed"
	DriftAdded   = "added"
	DriftRemoved = "removed"
	DriftInvalid = "invalid"
)

// DriftEvent is one difference between an upstream's tools and its pins.
type DriftEvent struct {
	Upstream string
	Tool     string // the upstream's tool name
	Kind     string
	Pinned   digest.Digest // zero for added
	Got      digest.Digest // zero for removed
	Detail   string
}

func (d DriftEvent) String() string {
	switch d.Kind {
	case DriftChanged:
		return fmt.Sprintf("tool %q of upstream %q changed: its definition digest is %s, the pin is %s", d.Tool, d.Upstream, d.Got, d.Pinned)
	case DriftAdded:
		return fmt.Sprintf("tool %q of upstream %q is not pinned (digest %s)", d.Tool, d.Upstream, d.Got)
	case DriftRemoved:
		return fmt.Sprintf("pinned tool %q of upstream %q is gone", d.Tool, d.Upstream)
	default:
		return fmt.Sprintf("tool %q of upstream %q refused: %s", d.Tool, d.Upstream, d.Detail)
	}
}

// Check compares an upstream's tools with pins (tool name -> digest). It
// returns each tool's digest, the tools that match (accepted) and the drift.
// In warn mode (refuse == false) drifted tools are accepted too; invalid
// tools never are.
func Check(upstream string, tools []*mcp.Tool, pins map[string]digest.Digest, refuse bool) (accepted []*mcp.Tool, digests map[string]digest.Digest, drift []DriftEvent) {
	digests = map[string]digest.Digest{}
	seen := map[string]bool{}
	for _, t := range tools {
		if seen[t.Name] {
			drift = append(drift, DriftEvent{Upstream: upstream, Tool: t.Name, Kind: DriftInvalid, Detail: "listed twice"})
			continue
		}
		seen[t.Name] = true
		d, err := Pin(t)
		if err == nil {
			err = CheckSchema(t)
		}
		if err != nil {
			drift = append(drift, DriftEvent{Upstream: upstream, Tool: t.Name, Kind: DriftInvalid, Detail: err.Error()})
			continue
		}
		digests[t.Name] = d
		want, ok := pins[t.Name]
		switch {
		case !ok:
			drift = append(drift, DriftEvent{Upstream: upstream, Tool: t.Name, Kind: DriftAdded, Got: d})
			if refuse {
				continue
			}
		case !want.Equal(d):
			drift = append(drift, DriftEvent{Upstream: upstream, Tool: t.Name, Kind: DriftChanged, Pinned: want, Got: d})
			if refuse {
				continue
			}
		}
		accepted = append(accepted, t)
	}
	names := make([]string, 0, len(pins))
	for n := range pins {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !seen[n] {
			drift = append(drift, DriftEvent{Upstream: upstream, Tool: n, Kind: DriftRemoved, Pinned: pins[n]})
		}
	}
	return accepted, digests, drift
}

// Entry is one exposed tool.
type Entry struct {
	Exposed  string        // name shown to agents
	Upstream string        // upstream name
	Name     string        // the upstream's own tool name
	Pin      digest.Digest // digest of the upstream's definition
	// Definition is the digest of the definition as exposed (Pin of the
	// upstream's tool): it differs from Pin when drift: warn let a changed
	// tool through, so that a session can tell that what it shows changed.
	Definition digest.Digest
	Tool       *mcp.Tool // the definition as exposed (Name = Exposed)
}

// Catalog maps exposed names to entries.
type Catalog struct {
	entries map[string]*Entry
	order   []string
	// contested are exposed names that tools of two upstreams map to
	// (upstream "a" tool "_b" and upstream "a_" tool "b" are both
	// "a___b"): exposed for neither.
	contested map[string]claim
}

// claim is the upstream and tool that first claimed a contested name.
type claim struct{ upstream, tool string }

// New returns an empty catalog.
func New() *Catalog { return &Catalog{entries: map[string]*Entry{}, contested: map[string]claim{}} }

// Add exposes upstream's accepted tools. A tool whose exposed name is invalid
// is refused and returned as a drift event of kind "invalid". So is a tool
// whose exposed name another upstream's tool also maps to, and that other
// tool with it (never suffixed): a contested name is exposed for neither,
// whichever upstream was added first. Which upstream a name means must not
// depend on which one happened to be up when the catalog was built (an
// upstream that starts late would take the name over from the other, under
// agents and policies that use it).
func (c *Catalog) Add(upstream string, namespaced bool, tools []*mcp.Tool, digests map[string]digest.Digest) []DriftEvent {
	var refused []DriftEvent
	collision := func(name, tool, otherUp, otherTool string) DriftEvent {
		return DriftEvent{Upstream: upstream, Tool: tool, Kind: DriftInvalid,
			Detail: fmt.Sprintf("exposed name %q is also that of tool %q of upstream %q, so it is exposed for neither; rename one of the upstreams", name, otherTool, otherUp)}
	}
	for _, t := range tools {
		name, err := Exposed(upstream, t.Name, namespaced)
		if err != nil {
			refused = append(refused, DriftEvent{Upstream: upstream, Tool: t.Name, Kind: DriftInvalid, Detail: err.Error()})
			continue
		}
		if first, ok := c.contested[name]; ok {
			refused = append(refused, collision(name, t.Name, first.upstream, first.tool))
			continue
		}
		if prev, dup := c.entries[name]; dup {
			refused = append(refused, collision(name, t.Name, prev.Upstream, prev.Name))
			ev := collision(name, prev.Name, upstream, t.Name)
			ev.Upstream = prev.Upstream
			refused = append(refused, ev)
			c.contested[name] = claim{prev.Upstream, prev.Name}
			c.drop(name)
			continue
		}
		def, err := Pin(t)
		if err != nil {
			refused = append(refused, DriftEvent{Upstream: upstream, Tool: t.Name, Kind: DriftInvalid, Detail: err.Error()})
			continue
		}
		exp := *t
		exp.Name = name
		c.entries[name] = &Entry{Exposed: name, Upstream: upstream, Name: t.Name, Pin: digests[t.Name], Definition: def, Tool: &exp}
		c.order = append(c.order, name)
	}
	return refused
}

// drop removes one exposed name.
func (c *Catalog) drop(name string) {
	delete(c.entries, name)
	c.order = slices.DeleteFunc(c.order, func(n string) bool { return n == name })
}

// Remove drops every tool of upstream and returns their exposed names.
func (c *Catalog) Remove(upstream string) []string {
	var gone []string
	kept := c.order[:0]
	for _, n := range c.order {
		if c.entries[n].Upstream == upstream {
			gone = append(gone, n)
			delete(c.entries, n)
			continue
		}
		kept = append(kept, n)
	}
	c.order = kept
	return gone
}

// Lookup returns the entry for an exposed name.
func (c *Catalog) Lookup(exposed string) (*Entry, bool) {
	e, ok := c.entries[exposed]
	return e, ok
}

// Entries returns the entries in the order they were added.
func (c *Catalog) Entries() []*Entry {
	out := make([]*Entry, 0, len(c.order))
	for _, n := range c.order {
		out = append(out, c.entries[n])
	}
	return out
}

// Digest is the digest of the canonical JSON of every exposed name and pin,
// sorted: what the genesis record calls the catalog digest.
func (c *Catalog) Digest() digest.Digest {
	m := map[string]string{}
	for n, e := range c.entries {
		m[n] = e.Upstream + "/" + e.Name + "@" + e.Pin.String()
	}
	b, _ := json.Marshal(m)
	d, _ := digest.JSON(b)
	return d
}
