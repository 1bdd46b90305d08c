package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cedar-policy/cedar-go"
	cedarast "github.com/cedar-policy/cedar-go/ast"
	xast "github.com/cedar-policy/cedar-go/x/exp/ast"
	"github.com/cedar-policy/cedar-go/x/exp/schema"
	"github.com/cedar-policy/cedar-go/x/exp/schema/validate"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Bundle is a loaded, validated policy bundle: every policy of every .cedar
// file of a directory, checked against the directory's .cedarschema, and the
// tree digest of the directory.
type Bundle struct {
	dir     string
	digest  digest.Digest
	schema  string   // bundle-relative path of the schema file
	files   []string // bundle-relative paths of the policy files, sorted
	set     *cedar.PolicySet
	ids     []string // policy ids in file order
	index   map[string]int
	forbids map[cedar.PolicyID]bool
	// argScopes holds, for every policy that reads context.arguments, a
	// permit with the same scope and no conditions (see DependsOnArguments).
	argScopes *cedar.PolicySet
	// uriScopes is the same for the policies that read context.uri (see
	// DependsOnURI).
	uriScopes *cedar.PolicySet
	// contextReads are the context attributes some policy reads;
	// readsAllContext is set when a policy uses the context record whole.
	contextReads    map[string]bool
	readsAllContext bool
	// readsToolsUsed is set when a policy may read
	// context.session.tools_used: it names it, or uses context.session
	// other than by reading its calls or id or testing has.
	readsToolsUsed bool
	// use is what Decide puts in the context: the attributes some policy
	// may read (nil: all of them).
	use *contextUse
	// argTypes are the argument types the schema declares, checked at
	// every call when some policy reads context.arguments (nil: none; see
	// argtypes.go).
	argTypes *argType
	position map[cedar.PolicyID]string
}

// Dir is the directory the bundle was loaded from.
func (b *Bundle) Dir() string { return b.dir }

// Digest is the tree digest of the bundle directory (pkg/digest.Tree).
func (b *Bundle) Digest() digest.Digest { return b.digest }

// Files lists the bundle's policy files (relative to Dir), then its schema.
func (b *Bundle) Files() []string { return append(slices.Clone(b.files), b.schema) }

// PolicyIDs lists the ids of the bundle's policies in file order.
func (b *Bundle) PolicyIDs() []string { return slices.Clone(b.ids) }

// Position is the file:line:col where the policy with this id starts.
func (b *Bundle) Position(id string) string { return b.position[cedar.PolicyID(id)] }

// LoadError is a bundle that cannot be used: the file (and line and column
// when known) and the reason.
type LoadError struct {
	File   string // path of the offending file, or the bundle directory
	Line   int    // 0 when unknown
	Col    int    // 0 when unknown
	Reason string
	Hint   string
	code   int
}

func (e *LoadError) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc += ":" + strconv.Itoa(e.Line)
		if e.Col > 0 {
			loc += ":" + strconv.Itoa(e.Col)
		}
	}
	return "policy bundle: " + loc + ": " + e.Reason
}

// ExitCode is exitcode.ExitMismatch for a pin mismatch, exitcode.ExitIO when the bundle
// cannot be read, and exitcode.ExitConfig otherwise.
func (e *LoadError) ExitCode() int {
	if e.code != 0 {
		return e.code
	}
	return exitcode.ExitConfig
}

// Hints says what to do about it.
func (e *LoadError) Hints() []string {
	if e.Hint == "" {
		return nil
	}
	return []string{e.Hint}
}

// LoadOptions are the options of Load.
type LoadOptions struct {
	// Expect pins the bundle's tree digest; the zero Digest means no pin.
	Expect digest.Digest
	// Progress is passed to digest.Tree.
	Progress func(files, bytes int64)
}

// Limits on what a bundle may hold. A bundle past them is refused.
const (
	maxBundleFiles = 10000
	maxFileBytes   = 4 << 20
)

// Load reads, parses and validates the bundle in dir. It fails, naming the
// file, line and reason, when a policy does not parse, when a policy does not
// validate against the schema, when the schema does not describe the
// gateway's entity model, or when the bundle's digest does not match
// opts.Expect.
func Load(ctx context.Context, dir string, opts LoadOptions) (*Bundle, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, &LoadError{File: dir, Reason: fmt.Sprintf("cannot read bundle directory: %v", errors.Unwrap(err)), code: exitcode.ExitIO,
			Hint: "policy.dir must name a directory of .cedar files and one .cedarschema"}
	}
	if !st.IsDir() {
		return nil, &LoadError{File: dir, Reason: "not a directory",
			Hint: "policy.dir must name a directory of .cedar files and one .cedarschema"}
	}
	// The bundle is read once: the files parsed are the files whose digest
	// is compared with the pin, even if the directory changes meanwhile.
	snap, d, err := readBundle(ctx, dir, opts.Progress)
	if err != nil {
		return nil, err
	}
	// Compile before the pin check: a bundle that does not parse or validate
	// is reported at its file and line, and the hint below never offers the
	// digest of a bundle that could not run.
	b, err := compile(dir, snap)
	if err != nil {
		return nil, err
	}
	if !opts.Expect.IsZero() && !opts.Expect.Equal(d) {
		return nil, &LoadError{File: dir, code: exitcode.ExitMismatch,
			Reason: fmt.Sprintf("digest %s does not match the pin %s", d, opts.Expect),
			Hint:   fmt.Sprintf("if this bundle is the one you approved, set policy.expect: %s", d)}
	}
	b.digest = d
	return b, nil
}

type bundleFile struct {
	rel  string
	data []byte
}

type snapshot struct {
	schema   bundleFile
	policies []bundleFile
}

// isBundleFile reports whether the file at rel is read as a policy or the
// schema.
func isBundleFile(rel string) bool {
	ext := path.Ext(rel)
	return ext == ".cedar" || ext == ".cedarschema"
}

// readBundle reads the directory tree once (digest.ReadTree, bounded) and
// returns every .cedar file under dir (sorted by path) and the single
// .cedarschema at its top level, with the tree digest of what was read:
// every file counts, and the policies and schema counted are the bytes
// returned.
func readBundle(ctx context.Context, dir string, progress func(files, bytes int64)) (*snapshot, digest.Digest, error) {
	tree, err := digest.ReadTree(ctx, dir, digest.ReadTreeOptions{
		TreeOptions:  digest.TreeOptions{Progress: progress},
		Keep:         isBundleFile,
		MaxEntries:   maxBundleFiles,
		MaxKeptBytes: maxFileBytes,
	})
	if err != nil {
		if errors.Is(err, digest.ErrTreeLimit) {
			return nil, digest.Digest{}, &LoadError{File: dir, Reason: strings.TrimPrefix(err.Error(), "tree "+dir+": "),
				Hint: fmt.Sprintf("a bundle holds at most %d files and directories, and each policy or schema at most %d bytes", maxBundleFiles, maxFileBytes)}
		}
		return nil, digest.Digest{}, &LoadError{File: dir, Reason: fmt.Sprintf("cannot read: %v", strings.TrimPrefix(err.Error(), "tree "+dir+": ")), code: exitcode.ExitIO}
	}
	var s snapshot
	var schemas []string
	for _, e := range tree.Entries {
		if !isBundleFile(e.Path) {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(e.Path))
		if e.Type != 0 {
			return nil, digest.Digest{}, &LoadError{File: p, Reason: "not a regular file (symlinks and devices are not allowed in a bundle)"}
		}
		if path.Ext(e.Path) == ".cedarschema" {
			if strings.Contains(e.Path, "/") {
				return nil, digest.Digest{}, &LoadError{File: p, Reason: "a .cedarschema must sit at the top of the bundle directory"}
			}
			schemas = append(schemas, e.Path)
			s.schema = bundleFile{rel: e.Path, data: e.Data}
		} else {
			s.policies = append(s.policies, bundleFile{rel: e.Path, data: e.Data})
		}
	}
	switch {
	case len(schemas) == 0:
		return nil, digest.Digest{}, &LoadError{File: dir, Reason: "no .cedarschema file",
			Hint: "a bundle needs its schema: copy examples/policy/schema.cedarschema and extend CallArgs"}
	case len(schemas) > 1:
		return nil, digest.Digest{}, &LoadError{File: dir, Reason: fmt.Sprintf("more than one .cedarschema (%s)", strings.Join(schemas, ", "))}
	case len(s.policies) == 0:
		return nil, digest.Digest{}, &LoadError{File: dir, Reason: "no .cedar policy files",
			Hint: "a bundle without policies denies every call; add at least one .cedar file"}
	}
	return &s, tree.Digest, nil
}

var parsePos = regexp.MustCompile(`^(?:parser error: )?parse error at <input>:(\d+):(\d+) (.*)$`)

// compile parses the schema and the policies and validates each policy
// against the schema with cedar-go's validator (strict mode).
func compile(dir string, snap *snapshot) (*Bundle, error) {
	v, argTypes, err := compileSchema(dir, snap)
	if err != nil {
		return nil, err
	}

	b := &Bundle{
		dir:          dir,
		schema:       snap.schema.rel,
		set:          cedar.NewPolicySet(),
		forbids:      map[cedar.PolicyID]bool{},
		position:     map[cedar.PolicyID]string{},
		index:        map[string]int{},
		argScopes:    cedar.NewPolicySet(),
		uriScopes:    cedar.NewPolicySet(),
		contextReads: map[string]bool{},
	}
	for _, f := range snap.policies {
		path := filepath.Join(dir, filepath.FromSlash(f.rel))
		list, err := cedar.NewPolicyListFromBytes(path, f.data)
		if err != nil {
			if m := parsePos.FindStringSubmatch(err.Error()); m != nil {
				line, _ := strconv.Atoi(m[1])
				col, _ := strconv.Atoi(m[2])
				return nil, &LoadError{File: path, Line: line, Col: col, Reason: "syntax: " + m[3]}
			}
			return nil, &LoadError{File: path, Reason: "syntax: " + strings.TrimPrefix(err.Error(), "parser error: ")}
		}
		b.files = append(b.files, f.rel)
		for _, p := range list {
			pos := p.Position()
			loc := fmt.Sprintf("%s:%d:%d", f.rel, pos.Line, pos.Column)
			id := loc
			if a, ok := p.Annotations()["id"]; ok {
				id = string(a)
				if id == "" {
					return nil, &LoadError{File: path, Line: pos.Line, Col: pos.Column, Reason: `empty @id("")`}
				}
			}
			pid := cedar.PolicyID(id)
			if prev, dup := b.position[pid]; dup {
				return nil, &LoadError{File: path, Line: pos.Line, Col: pos.Column,
					Reason: fmt.Sprintf("policy id %q is already used at %s", id, prev),
					Hint:   `give every policy a unique @id("...")`}
			}
			if err := v.Policy(id, (*xast.Policy)(p.AST())); err != nil {
				return nil, &LoadError{File: path, Line: pos.Line, Col: pos.Column,
					Reason: "does not validate against " + snap.schema.rel + ": " + strings.ReplaceAll(err.Error(), "\n", "; ")}
			}
			if err := checkArgHas((*xast.Policy)(p.AST()), argTypes); err != nil {
				return nil, &LoadError{File: path, Line: pos.Line, Col: pos.Column, Reason: "context.arguments: " + err.Error(),
					Hint: "declare it in CallArgs, optional, with the type the tool takes (a call that sends it with another type is then denied); see examples/policy/README.md"}
			}
			b.set.Add(pid, p)
			b.index[id] = len(b.ids)
			b.ids = append(b.ids, id)
			b.position[pid] = loc
			b.forbids[pid] = p.Effect() == cedar.Forbid
			js, jerr := p.MarshalJSON()
			b.noteContextReads(js, jerr)
			a := (*xast.Policy)(p.AST())
			scope := &xast.Policy{Effect: xast.EffectPermit, Principal: a.Principal, Action: a.Action, Resource: a.Resource, Position: a.Position}
			if jerr != nil || bytes.Contains(js, []byte(`"arguments"`)) {
				b.argScopes.Add(pid, cedar.NewPolicyFromAST((*cedarast.Policy)(scope)))
			}
			if jerr != nil || bytes.Contains(js, []byte(`"uri"`)) {
				b.uriScopes.Add(pid, cedar.NewPolicyFromAST((*cedarast.Policy)(scope)))
			}
		}
	}
	b.use = &contextUse{session: b.readsContext("session"), now: b.readsContext("now"), arguments: b.readsContext("arguments"),
		uri: b.readsContext("uri"), prompt: b.readsContext("prompt")}
	if b.readsContext("arguments") {
		// Types matter only to a policy that reads the arguments: a bundle
		// that reads none (its schema may still declare the template's
		// path) takes any argument of any type, as it always did.
		b.argTypes = argTypes
	}
	return b, nil
}

// compileSchema parses and resolves the bundle's schema, checks that it
// describes the gateway's entity model, and returns the validator of the
// policies and the types of context.arguments it declares.
func compileSchema(dir string, snap *snapshot) (*validate.Validator, *argType, error) {
	schemaPath := filepath.Join(dir, filepath.FromSlash(snap.schema.rel))
	var sch schema.Schema
	sch.SetFilename(schemaPath)
	if err := sch.UnmarshalCedar(snap.schema.data); err != nil {
		return nil, nil, schemaParseError(schemaPath, err)
	}
	resolved, err := sch.Resolve()
	if err != nil {
		return nil, nil, &LoadError{File: schemaPath, Reason: fmt.Sprintf("schema: %v", err)}
	}
	v := validate.New(resolved)
	if err := checkEntityModel(v); err != nil {
		return nil, nil, &LoadError{File: schemaPath, Reason: "the schema does not describe the gateway's entity model: " + err.Error(),
			Hint: "start from examples/policy/schema.cedarschema; see internal/policy's documentation for the entity model"}
	}
	argTypes, err := callArgsType(resolved)
	if err != nil {
		return nil, nil, &LoadError{File: schemaPath, Reason: "context.arguments: " + err.Error(),
			Hint: "declare it a String (or a Long, Bool, decimal, set or record), the types a JSON argument converts to; see examples/policy/README.md"}
	}
	return v, argTypes, nil
}

var schemaPos = regexp.MustCompile(`^(.*):(\d+):(\d+): (.*)$`)

func schemaParseError(path string, err error) error {
	msg := err.Error()
	if m := schemaPos.FindStringSubmatch(msg); m != nil && m[1] == path {
		line, _ := strconv.Atoi(m[2])
		col, _ := strconv.Atoi(m[3])
		return &LoadError{File: path, Line: line, Col: col, Reason: "schema syntax: " + m[4]}
	}
	return &LoadError{File: path, Reason: "schema syntax: " + msg}
}

var (
	ctxVar    = []byte(`{"Var":"context"}`)
	ctxAccess = [][]byte{[]byte(`{".":{"left":{"Var":"context"},"attr":"`), []byte(`{"has":{"left":{"Var":"context"},"attr":"`)}
	// sessionVar is context.session; sessionNotToolsUsed are its uses that
	// do not read tools_used (a has test is true whatever the set holds).
	sessionVar          = []byte(`{".":{"left":{"Var":"context"},"attr":"session"}}`)
	sessionNotToolsUsed = [][]byte{
		[]byte(`{".":{"left":{".":{"left":{"Var":"context"},"attr":"session"}},"attr":"calls"}}`),
		[]byte(`{".":{"left":{".":{"left":{"Var":"context"},"attr":"session"}},"attr":"id"}}`),
		[]byte(`{"has":{"left":{".":{"left":{"Var":"context"},"attr":"session"}},"attr":"`),
	}
)

// noteContextReads records which context attributes a policy (in Cedar's
// JSON form) reads. Every use of the context variable is either an
// attribute access or a has test naming the attribute; any other use (the
// record as a whole) means the policy may read every attribute.
func (b *Bundle) noteContextReads(js []byte, err error) {
	if err != nil {
		b.readsAllContext = true
		return
	}
	uses := bytes.Count(js, ctxVar)
	named := 0
	for _, pre := range ctxAccess {
		rest := js
		for {
			i := bytes.Index(rest, pre)
			if i < 0 {
				break
			}
			rest = rest[i+len(pre):]
			j := bytes.IndexByte(rest, '"')
			if j < 0 {
				b.readsAllContext = true
				return
			}
			b.contextReads[string(rest[:j])] = true
			named++
		}
	}
	if named != uses {
		b.readsAllContext = true
	}
	other := bytes.Count(js, sessionVar)
	for _, u := range sessionNotToolsUsed {
		other -= bytes.Count(js, u)
	}
	if other != 0 {
		b.readsToolsUsed = true
	}
}

// readsContext reports whether some policy may read the context attribute.
func (b *Bundle) readsContext(attr string) bool { return b.readsAllContext || b.contextReads[attr] }

// ReadsURI reports whether some policy may read context.uri: when it is
// false, every read_resource decision on an upstream is the same whatever
// the URI (the gateway then filters resources/list per upstream).
func (b *Bundle) ReadsURI() bool { return b.readsContext("uri") }

// ReadsPrompt reports whether some policy may read context.prompt.
func (b *Bundle) ReadsPrompt() bool { return b.readsContext("prompt") }

// ReadsSession reports whether some policy may read context.session.
func (b *Bundle) ReadsSession() bool { return b.readsContext("session") }

// ReadsToolsUsed reports whether some policy may read
// context.session.tools_used, the one session fact that depends on the
// decisions of the session's earlier calls (calls counts every decided
// call, refused or not; see Engine.DecideCall).
func (b *Bundle) ReadsToolsUsed() bool { return b.readsAllContext || b.readsToolsUsed }
