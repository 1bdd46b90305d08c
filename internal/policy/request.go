package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	"github.com/go-json-experiment/json/jsontext"
)

// Action is what the agent asks to do.
type Action string

// The actions of the entity model.
const (
	ActionCallTool  Action = "call_tool"  // tools/call
	ActionListTools Action = "list_tools" // a tool's entry in tools/list
	// ActionReadResource is resources/read, resources/subscribe and
	// completion/complete on a ref/resource; it also decides which entries
	// of resources/list and resources/templates/list an agent sees. Its
	// resource is the Upstream; its context has the URI.
	ActionReadResource Action = "read_resource"
	// ActionGetPrompt is prompts/get and completion/complete on a
	// ref/prompt; it also decides which entries of prompts/list an agent
	// sees. Its resource is the Upstream; its context has the prompt's name.
	ActionGetPrompt Action = "get_prompt"
)

// OnUpstream reports whether the action's resource is the Upstream itself
// (read_resource, get_prompt) rather than a Tool.
func (a Action) OnUpstream() bool { return a == ActionReadResource || a == ActionGetPrompt }

// Annotations are the MCP tool annotations the policy sees, with the MCP
// defaults applied to hints the tool does not declare (readOnlyHint false,
// destructiveHint true, idempotentHint false, openWorldHint true).
type Annotations struct {
	ReadOnly    bool `json:"readOnlyHint"`
	Destructive bool `json:"destructiveHint"`
	Idempotent  bool `json:"idempotentHint"`
	OpenWorld   bool `json:"openWorldHint"`
}

// DefaultAnnotations are the MCP defaults for a tool that declares no hints.
var DefaultAnnotations = Annotations{Destructive: true, OpenWorld: true}

// Session holds the facts about the agent's session at the time of the
// decision.
type Session struct {
	ID string `json:"id"`
	// Calls is the number of tools/call requests of this session decided
	// before this one, whatever their decision.
	Calls int64 `json:"calls"`
	// ToolsUsed are the exposed names of the tools this session's earlier
	// calls were forwarded to, each once.
	ToolsUsed []string `json:"tools_used"`
}

// Request is everything a decision depends on. Replay rebuilds it from the
// audit log; the same Request always gives the same Decision.
type Request struct {
	Action        Action
	Agent         string   // authenticated identity: Agent::"<Agent>"
	Groups        []string // the agent's groups from the config: Group::"<g>" parents
	Tool          string   // exposed name: Tool::"<Tool>" (normally "<upstream>__<tool>"); empty for read_resource and get_prompt
	ToolName      string   // the tool's name at its upstream
	Upstream      string   // Upstream::"<Upstream>", the tool's parent (the resource itself for read_resource and get_prompt)
	EvidenceClass string   // the upstream's evidence class (pkg/evidence)
	// Machine is the tunnel machine a call_tool request is routed to
	// (context.machine); empty for other upstreams and actions.
	Machine     string
	Annotations Annotations
	// Arguments are the exact bytes of params.arguments (a JSON object, or
	// empty). Only call_tool uses them.
	Arguments []byte
	// URI is the resource's URI (read_resource only; a resource template's
	// URI template when the request is about a template).
	URI string
	// Prompt is the prompt's name at its upstream (get_prompt only).
	Prompt  string
	Session Session
	// Time is the decision time; Cedar sees it with millisecond precision.
	Time time.Time
}

// Limits on the arguments given to Cedar. Past them the call is denied with
// an error that names the limit.
const (
	MaxArgumentBytes  = 1 << 20 // bytes of params.arguments
	MaxArgumentDepth  = 32      // nesting of objects and arrays
	MaxArgumentValues = 10000   // values (scalars, objects, arrays)
)

// ArgumentsError is an argument object that cannot be given to Cedar. Its
// Reason goes into the call record in clear: it never holds anything of
// the payload (no value, no member name, no JSON pointer), only the limit
// passed or the kind of fault, and the attribute names the bundle's schema
// declares.
type ArgumentsError struct{ Reason string }

func (e *ArgumentsError) Error() string { return "arguments: " + e.Reason }

var (
	typAgent    = cedar.EntityType("Agent")
	typGroup    = cedar.EntityType("Group")
	typTool     = cedar.EntityType("Tool")
	typUpstream = cedar.EntityType("Upstream")
	typAction   = cedar.EntityType("Action")

	uidCallTool     = cedar.NewEntityUID(typAction, "call_tool")
	uidListTools    = cedar.NewEntityUID(typAction, "list_tools")
	uidReadResource = cedar.NewEntityUID(typAction, "read_resource")
	uidGetPrompt    = cedar.NewEntityUID(typAction, "get_prompt")
)

// entities is the entity store of one request: the agent and its groups, the
// tool and its upstream (only the upstream for read_resource and
// get_prompt), the actions. It is built per request without a map.
type entities struct {
	agent    cedar.Entity
	groups   []cedar.EntityUID
	tool     cedar.Entity
	upstream cedar.Entity
}

func (e *entities) Get(uid cedar.EntityUID) (cedar.Entity, bool) {
	switch uid.Type {
	case typAgent:
		if uid == e.agent.UID {
			return e.agent, true
		}
	case typGroup:
		for _, g := range e.groups {
			if g == uid {
				return cedar.Entity{UID: uid}, true
			}
		}
	case typTool:
		if uid == e.tool.UID {
			return e.tool, true
		}
	case typUpstream:
		if uid == e.upstream.UID {
			return e.upstream, true
		}
	case typAction:
		if uid == uidCallTool || uid == uidListTools || uid == uidReadResource || uid == uidGetPrompt {
			return cedar.Entity{UID: uid}, true
		}
	}
	return cedar.Entity{}, false
}

// The entities of agents and tools do not change from call to call: they are
// built once and cached (bounded; past the bound they are built per call).
const maxCached = 4096

type agentEnt struct {
	agent  cedar.Entity
	groups []cedar.EntityUID
}

type toolEnt struct{ tool, upstream cedar.Entity }

var (
	agentCache, toolCache   sync.Map
	agentCached, toolCached atomic.Int64
)

func agentEntity(agent string, groups []string) (cedar.Entity, []cedar.EntityUID) {
	// Every part length-prefixed: names may hold any byte (a certificate
	// subject can hold a NUL), so no two principals share a key.
	var buf [128]byte
	k := appendField(buf[:0], agent)
	for _, g := range groups {
		k = appendField(k, g)
	}
	key := string(k)
	if v, ok := agentCache.Load(key); ok {
		a := v.(*agentEnt)
		return a.agent, a.groups
	}
	uids := make([]cedar.EntityUID, len(groups))
	for i, g := range groups {
		uids[i] = cedar.NewEntityUID(typGroup, cedar.String(g))
	}
	a := &agentEnt{agent: cedar.Entity{UID: cedar.NewEntityUID(typAgent, cedar.String(agent)), Parents: cedar.NewEntityUIDSet(uids...)}, groups: uids}
	if agentCached.Add(1) <= maxCached {
		agentCache.Store(key, a)
	}
	return a.agent, a.groups
}

// appendField appends s to a cache key, length-prefixed (as memo.go's
// field does), so that no two sequences of parts make the same key.
func appendField(k []byte, s string) []byte {
	k = strconv.AppendInt(k, int64(len(s)), 10)
	k = append(k, ':')
	return append(k, s...)
}

func toolEntities(r *Request) (cedar.Entity, cedar.Entity) {
	an := r.Annotations
	hints := []byte{'0', '0', '0', '0'}
	for i, h := range []bool{an.ReadOnly, an.Destructive, an.Idempotent, an.OpenWorld} {
		if h {
			hints[i] = '1'
		}
	}
	var buf [128]byte
	k := appendField(buf[:0], r.Tool)
	k = appendField(k, r.ToolName)
	k = appendField(k, r.Upstream)
	k = appendField(k, r.EvidenceClass)
	key := string(append(k, hints...))
	if v, ok := toolCache.Load(key); ok {
		t := v.(*toolEnt)
		return t.tool, t.upstream
	}
	upUID := cedar.NewEntityUID(typUpstream, cedar.String(r.Upstream))
	class := cedar.String(r.EvidenceClass)
	t := &toolEnt{
		upstream: cedar.Entity{UID: upUID, Attributes: cedar.NewRecord(cedar.RecordMap{"evidence_class": class})},
		tool: cedar.Entity{
			UID:     cedar.NewEntityUID(typTool, cedar.String(r.Tool)),
			Parents: cedar.NewEntityUIDSet(upUID),
			Attributes: cedar.NewRecord(cedar.RecordMap{
				"name":           cedar.String(r.ToolName),
				"upstream":       cedar.String(r.Upstream),
				"evidence_class": class,
				"annotations": cedar.NewRecord(cedar.RecordMap{
					"readOnlyHint":    cedar.Boolean(an.ReadOnly),
					"destructiveHint": cedar.Boolean(an.Destructive),
					"idempotentHint":  cedar.Boolean(an.Idempotent),
					"openWorldHint":   cedar.Boolean(an.OpenWorld),
				}),
			}),
		},
	}
	if toolCached.Add(1) <= maxCached {
		toolCache.Store(key, t)
	}
	return t.tool, t.upstream
}

// upstreamEntity is the Upstream entity of read_resource and get_prompt.
func upstreamEntity(name, class string) cedar.Entity {
	return cedar.Entity{UID: cedar.NewEntityUID(typUpstream, cedar.String(name)),
		Attributes: cedar.NewRecord(cedar.RecordMap{"evidence_class": cedar.String(class)})}
}

// build turns a Request into a Cedar request and its entities.
func build(r *Request) (cedar.Request, *entities, error) {
	return buildFor(r, allContext)
}

// contextUse says which context attributes a bundle's policies may read,
// and the declared types the arguments are checked against (nil: none).
type contextUse struct {
	session, now, arguments, uri, prompt bool
	types                                *argType
}

var allContext = contextUse{session: true, now: true, arguments: true, uri: true, prompt: true}

// buildFor builds the request with the context attributes in use; the
// others are left out, since no policy could tell. The arguments are checked
// against the limits either way (arguments past them deny, read or not),
// and converted only when read; then they are also checked against the
// types the schema declares (use.types, see argtypes.go). Were a read ever
// missed (Bundle.use is derived from the policies' JSON form,
// conservatively), the policy would meet a missing attribute: an
// evaluation error, which denies (a forbid that errors counts as matching,
// a permit that errors does not permit).
func buildFor(r *Request, use contextUse) (cedar.Request, *entities, error) {
	req, e, err := buildScope(r)
	if err != nil {
		return req, e, err
	}
	ctx := make(cedar.RecordMap, 3)
	if use.session {
		used := make([]cedar.Value, len(r.Session.ToolsUsed))
		for i, t := range r.Session.ToolsUsed {
			used[i] = cedar.String(t)
		}
		ctx["session"] = cedar.NewRecord(cedar.RecordMap{
			"id":         cedar.String(r.Session.ID),
			"calls":      cedar.Long(r.Session.Calls),
			"tools_used": cedar.NewSet(used...),
		})
	}
	if use.now {
		ctx["now"] = cedar.NewDatetimeFromMillis(r.Time.UnixMilli())
	}
	if r.Action == ActionCallTool {
		args, err := convertArguments(r.Arguments, !use.arguments, use.types)
		if err != nil {
			return cedar.Request{}, nil, err
		}
		if use.arguments {
			ctx["arguments"] = args
		}
		if r.Machine != "" {
			ctx["machine"] = cedar.String(r.Machine)
		}
	}
	if r.Action == ActionReadResource && use.uri {
		ctx["uri"] = cedar.String(r.URI)
	}
	if r.Action == ActionGetPrompt && use.prompt {
		ctx["prompt"] = cedar.String(r.Prompt)
	}
	req.Context = cedar.NewRecord(ctx)
	return req, e, nil
}

// buildScope builds the principal, action and resource of a request and its
// entities, without the context.
func buildScope(r *Request) (cedar.Request, *entities, error) {
	var act cedar.EntityUID
	switch r.Action {
	case ActionCallTool:
		act = uidCallTool
	case ActionListTools:
		act = uidListTools
	case ActionReadResource:
		act = uidReadResource
	case ActionGetPrompt:
		act = uidGetPrompt
	default:
		return cedar.Request{}, nil, fmt.Errorf("unknown action %q", r.Action)
	}
	e := &entities{}
	e.agent, e.groups = agentEntity(r.Agent, r.Groups)
	if r.Action.OnUpstream() {
		// The resource is the upstream; there is no tool.
		e.upstream = upstreamEntity(r.Upstream, r.EvidenceClass)
		return cedar.Request{Principal: e.agent.UID, Action: act, Resource: e.upstream.UID}, e, nil
	}
	e.tool, e.upstream = toolEntities(r)
	return cedar.Request{Principal: e.agent.UID, Action: act, Resource: e.tool.UID}, e, nil
}

// ArgumentsRecord converts the bytes of params.arguments to the Cedar record
// policies see as context.arguments:
//
//   - an object becomes a record; null members are left out (Cedar has no
//     null), so `context.arguments has x` is false for them;
//   - an array becomes a set: order and duplicates are lost, nulls dropped;
//   - a string a String, true/false a Bool;
//   - an integer in int64 range a Long; a number with at most four digits
//     after the point and no exponent a decimal; any other number the String
//     of its JSON literal (comparing it as a number is then an error, which
//     makes a forbid policy match: see Decision);
//   - empty input or null is the empty record.
//
// Arguments that are not an object, are not valid JSON, repeat a member name
// or exceed MaxArgumentBytes, MaxArgumentDepth or MaxArgumentValues are an
// *ArgumentsError.
//
// ArgumentsRecord does not check the types a bundle's schema declares, and
// keeps the members it does not declare; Bundle.Decide checks the types
// and leaves those members out (see argtypes.go).
func ArgumentsRecord(raw []byte) (cedar.Record, error) {
	return convertArguments(raw, false, nil)
}

// convertArguments is ArgumentsRecord, checking the arguments against the
// declared type want (nil: none); with check set it only checks the
// arguments, with the same errors, and returns an empty record.
func convertArguments(raw []byte, check bool, want *argType) (cedar.Record, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return cedar.NewRecord(nil), nil
	}
	if len(raw) > MaxArgumentBytes {
		return cedar.Record{}, &ArgumentsError{Reason: fmt.Sprintf("%d bytes, more than the policy limit of %d", len(raw), MaxArgumentBytes)}
	}
	if raw[0] != '{' {
		return cedar.Record{}, &ArgumentsError{Reason: "not a JSON object"}
	}
	c := converter{raw: raw, dec: jsontext.NewDecoder(bytes.NewReader(raw)), check: check}
	v, err := c.value(1, want)
	if err != nil {
		return cedar.Record{}, err
	}
	if _, err := c.dec.ReadToken(); err != io.EOF {
		return cedar.Record{}, &ArgumentsError{Reason: "trailing data after the object"}
	}
	if check {
		return cedar.NewRecord(nil), nil
	}
	return v.(cedar.Record), nil
}

type converter struct {
	raw    []byte
	dec    *jsontext.Decoder
	values int
	check  bool     // read and check every token, build no value
	path   []string // of the declared argument being read (argPath)
}

// value reads one JSON value and converts it; want is its declared type
// (nil: undeclared, not checked).
func (c *converter) value(depth int, want *argType) (cedar.Value, error) {
	if c.values++; c.values > MaxArgumentValues {
		return nil, &ArgumentsError{Reason: fmt.Sprintf("more than %d values, the policy limit", MaxArgumentValues)}
	}
	tok, err := c.dec.ReadToken()
	if err != nil {
		return nil, c.syntaxError(err, depth-1)
	}
	switch tok.Kind() {
	case '{', '[':
		if depth > MaxArgumentDepth {
			return nil, &ArgumentsError{Reason: fmt.Sprintf("nested deeper than %d levels, the policy limit", MaxArgumentDepth)}
		}
	}
	if want != nil && tok.Kind() != 'n' && !want.matches(tok) {
		return nil, mismatch(want, c.path, tok)
	}
	if c.check {
		switch tok.Kind() {
		case '{', '[':
		default:
			return nil, nil
		}
	}
	switch tok.Kind() {
	case 'n':
		return nil, nil
	case 't', 'f':
		return cedar.Boolean(tok.Bool()), nil
	case '"':
		return cedar.String(tok.String()), nil
	case '0':
		return number(tok.String()), nil
	case '{':
		return c.object(depth, want)
	case '[':
		return c.array(depth, want)
	}
	return nil, &ArgumentsError{Reason: fmt.Sprintf("unexpected JSON token %v", tok.Kind())}
}

// object reads the members of an object at depth, whose '{' value read,
// and its '}', and converts it to a record; want is its declared type
// (nil: undeclared), whose required attributes must all be there.
func (c *converter) object(depth int, want *argType) (cedar.Value, error) {
	m := cedar.RecordMap{}
	var present []bool // want's required attributes, by index
	if want != nil && len(want.required) > 0 {
		present = make([]bool, len(want.required))
	}
	for c.dec.PeekKind() != '}' {
		if err := c.member(depth, want, m, present); err != nil {
			return nil, err
		}
	}
	if _, err := c.dec.ReadToken(); err != nil {
		return nil, c.syntaxError(err, depth)
	}
	for i, ok := range present {
		if !ok {
			name := want.required[i]
			return nil, missing(want.attrs[name].t, append(c.path, name))
		}
	}
	if c.check {
		return nil, nil
	}
	return cedar.NewRecord(m), nil
}

// member reads one member of the object at depth being read into m (a
// null or a member want does not declare is left out), marking in
// present the required attribute of want it is.
func (c *converter) member(depth int, want *argType, m cedar.RecordMap, present []bool) error {
	k, err := c.dec.ReadToken()
	if err != nil {
		return c.syntaxError(err, depth)
	}
	var name cedar.String
	if !c.check || want != nil {
		name = cedar.String(k.String()) // valid until the next read
	}
	var attr argAttr
	if want != nil {
		attr = want.attrs[string(name)]
	}
	if attr.t != nil {
		c.path = append(c.path, string(name))
		if attr.index >= 0 {
			if c.dec.PeekKind() == 'n' {
				return missing(attr.t, c.path)
			}
			present[attr.index] = true
		}
	}
	if want != nil && attr.t == nil {
		// A member the declared record does not declare: read (the
		// limits and the syntax hold for it too) and left out, as a
		// null is (see argtypes.go).
		return c.skip(depth + 1)
	}
	v, err := c.value(depth+1, attr.t)
	if err != nil {
		return err
	}
	if attr.t != nil {
		c.path = c.path[:len(c.path)-1]
	}
	if v != nil {
		m[name] = v
	}
	return nil
}

// array reads the elements of an array at depth, whose '[' value read,
// and its ']', and converts it to a set; want is its declared type (nil:
// undeclared).
func (c *converter) array(depth int, want *argType) (cedar.Value, error) {
	var s []cedar.Value
	var elem *argType
	if want != nil {
		elem = want.elem
		c.path = append(c.path, "[]")
	}
	for c.dec.PeekKind() != ']' {
		v, err := c.value(depth+1, elem)
		if err != nil {
			return nil, err
		}
		if v != nil {
			s = append(s, v)
		}
	}
	if want != nil {
		c.path = c.path[:len(c.path)-1]
	}
	if _, err := c.dec.ReadToken(); err != nil {
		return nil, c.syntaxError(err, depth)
	}
	if c.check {
		return nil, nil
	}
	return cedar.NewSet(s...), nil
}

// skip reads one JSON value as value does, checking the limits and the
// syntax, and builds nothing.
func (c *converter) skip(depth int) error {
	check := c.check
	c.check = true
	_, err := c.value(depth, nil)
	c.check = check
	return err
}

// syntaxError is the error of arguments the decoder refuses, at depth (the
// nesting of the object or array being read; 0 outside the arguments
// object). Its text is fixed: the decoder's own names member names and
// JSON pointers, which come from the payload (a key can be a secret), and
// the error reaches the call record in clear, where the arguments are only
// a commitment.
func (c *converter) syntaxError(err error, depth int) error {
	var se *jsontext.SyntacticError
	switch {
	case errors.Is(err, jsontext.ErrDuplicateName):
		return &ArgumentsError{Reason: fmt.Sprintf("a member name is repeated (in an object at depth %d)", depth)}
	case !utf8.Valid(c.raw):
		return &ArgumentsError{Reason: "not valid UTF-8"}
	case errors.As(err, &se):
		return &ArgumentsError{Reason: fmt.Sprintf("not valid JSON (at byte %d)", se.ByteOffset)}
	}
	return &ArgumentsError{Reason: "not valid JSON"}
}

func number(lit string) cedar.Value {
	if !strings.ContainsAny(lit, ".eE") {
		if n, err := strconv.ParseInt(lit, 10, 64); err == nil {
			return cedar.Long(n)
		}
		return cedar.String(lit)
	}
	if i := strings.IndexByte(lit, '.'); i >= 0 && !strings.ContainsAny(lit, "eE") && len(lit)-i-1 <= 4 {
		if d, err := types.ParseDecimal(lit); err == nil {
			return d
		}
	}
	return cedar.String(lit)
}
