// Package config loads cmcp.yaml: schema version 1, loaded strictly. Unknown
// keys, duplicate keys, values of the wrong type and invalid settings are
// errors that name the file, line and column and say what to do. YAML
// anchors, aliases and merge keys are refused, and so is a file over
// MaxFileBytes (1 MiB) or one that is not a regular file. Each section
// lives in its own file of this package (upstreams.go, policy.go, ...) and
// is one field of Config.
package config

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/pkg/digest"
)

// Version is the only schema version this cmcp reads.
const Version = 1

// Config is a loaded cmcp.yaml. To add a section, add one field here with a
// yaml tag and put its type, with a Validate() error method, in a file of
// its own; Load checks unknown keys and types for it and calls Validate.
// An error about one value, valueAt(path...).errorf(...), is reported at
// that value's line.
type Config struct {
	// Version must be 1.
	Version int `yaml:"version"`
	// Upstreams are the MCP servers the gateway spawns or dials.
	Upstreams []Upstream `yaml:"upstreams"`
	// Policy is the Cedar bundle that decides every call.
	Policy *Policy `yaml:"policy"`
	// Server is the agent-facing MCP endpoint (gateway.go).
	Server *Server `yaml:"server"`
	// Audit is where and how the audit log is written (gateway.go).
	Audit *Audit `yaml:"audit"`
	// Catalog holds tool-definition pins and the drift action (gateway.go).
	Catalog *Catalog `yaml:"catalog"`
	// Admin is the operators' listener (health, metrics, kill switch).
	Admin *Admin `yaml:"admin"`

	// Path is the file the configuration was loaded from ("" for LoadBytes
	// without a name). Relative paths in the file are relative to its
	// directory.
	Path string `yaml:"-"`
	// Digest is the SHA-256 of the bytes the configuration was loaded
	// from (what the audit log's genesis records).
	Digest digest.Digest `yaml:"-"`

	// pos is where the settings that are checked after loading
	// (CheckListeners) are in the file.
	pos map[string]position
	// name is the file as named to Load (what errors show); root is its
	// YAML, for the positions of errors found after loading (CheckFiles,
	// CheckEnv).
	name string
	root *yaml.Node
}

// Error is one problem in a configuration file, at a position.
type Error struct {
	File      string
	Line, Col int    // 1-based; 0 when unknown (Col alone may be)
	Field     string // the setting, e.g. upstreams[0].pin.command
	Msg       string
	Hint      string // what to do, if there is something to say
	// err is the cause, when there is one to test for (a file that could
	// not be read: fs.ErrNotExist, fs.ErrPermission); see Unwrap.
	err error
}

// Unwrap returns the cause, if any: errors.Is(e, fs.ErrNotExist) tells a
// file that is not there from one that is there but unusable.
func (e *Error) Unwrap() error { return e.err }

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Col > 0 {
			fmt.Fprintf(&b, ":%d", e.Col)
		}
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ExitCode is exitcode.ExitConfig.
func (e *Error) ExitCode() int { return exitcode.ExitConfig }

// Hints returns the hint, if any.
func (e *Error) Hints() []string {
	if e.Hint == "" {
		return nil
	}
	return []string{e.Hint}
}

// Errors is every problem found in one file (Load reports them all at once).
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	if len(es) > 1 {
		return fmt.Sprintf("%d problems in the configuration:\n  %s", len(es), strings.Join(lines, "\n  "))
	}
	return strings.Join(lines, "\n")
}

// ExitCode is exitcode.ExitConfig.
func (es Errors) ExitCode() int { return exitcode.ExitConfig }

// Hints returns the distinct hints of all errors.
func (es Errors) Hints() []string {
	var hs []string
	for _, e := range es {
		if e.Hint != "" && !slices.Contains(hs, e.Hint) {
			hs = append(hs, e.Hint)
		}
	}
	return hs
}

// Unwrap lets errors.As find each *Error.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// MaxFileBytes bounds the size of a configuration file (1 MiB); a larger
// file is refused before it is read whole. The example configuration is
// under 2 KB.
const MaxFileBytes = 1 << 20

// Load reads and validates the configuration file at path. It must be a
// regular file of at most MaxFileBytes.
func Load(path string) (*Config, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, exitcode.Errorf(exitcode.ExitIO, "read config: %w", err)
	}
	c, err := parse(path, abs, data)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// readFile reads the configuration file at path: a regular file (a FIFO,
// device or directory is refused without blocking on it) of at most
// MaxFileBytes, of which no more than one byte over the bound is read.
func readFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return nil, exitcode.Errorf(exitcode.ExitIO, "read config: %w", err).Hint("run cmcp as a user who can read %s, or make it readable to this user", path)
		}
		return nil, exitcode.Errorf(exitcode.ExitIO, "read config: %w", err).Hint("pass the path of a cmcp.yaml file")
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, exitcode.Errorf(exitcode.ExitIO, "read config: %w", err)
	}
	if !fi.Mode().IsRegular() {
		what := "a " + fi.Mode().Type().String() + " file"
		switch t := fi.Mode().Type(); {
		case t&os.ModeDir != 0:
			what = "a directory"
		case t&os.ModeNamedPipe != 0:
			what = "a FIFO (named pipe)"
		case t&os.ModeSocket != 0:
			what = "a socket"
		case t&os.ModeDevice != 0:
			what = "a device"
		}
		return nil, exitcode.Errorf(exitcode.ExitIO, "read config: %s is %s, not a regular file", path, what).Hint("pass the path of a cmcp.yaml file")
	}
	if fi.Size() > MaxFileBytes {
		return nil, tooLarge(path, fmt.Sprintf("%d bytes", fi.Size()))
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, exitcode.Errorf(exitcode.ExitIO, "read config: %w", err)
	}
	if len(data) > MaxFileBytes { // it grew since the Stat
		return nil, tooLarge(path, fmt.Sprintf("more than %d bytes", MaxFileBytes))
	}
	return data, nil
}

// tooLarge is the error for a file of size bytes (what: "N bytes").
func tooLarge(name, what string) error {
	return Errors{{File: name, Msg: fmt.Sprintf("the file is %s; a configuration is at most %d bytes (1 MiB)", what, MaxFileBytes),
		Hint: "pass the path of a cmcp.yaml file; a configuration holds settings, not data"}}
}

// LoadBytes validates a configuration held in memory. name is used in
// errors; relative paths are taken relative to the working directory.
func LoadBytes(name string, data []byte) (*Config, error) {
	return parse(name, "", data)
}

// maxErrors bounds how many problems one Load reports.
const maxErrors = 20

// loader collects the errors of one file.
type loader struct {
	file string
	errs Errors
}

func (l *loader) errorf(n *yaml.Node, field, hint, format string, args ...any) {
	if len(l.errs) >= maxErrors {
		return
	}
	e := &Error{File: l.file, Field: field, Msg: fmt.Sprintf(format, args...), Hint: hint}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	l.errs = append(l.errs, e)
}

func parse(name, abs string, data []byte) (*Config, error) {
	if len(data) > MaxFileBytes {
		return nil, tooLarge(name, fmt.Sprintf("%d bytes", len(data)))
	}
	l := &loader{file: name}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			l.errorf(nil, "", "start the file with: version: 1", "the configuration is empty")
			return nil, l.errs
		}
		l.syntaxError(data, err)
		return nil, l.errs
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		l.errorf(&extra, "", "keep one configuration per file", "a second YAML document (---) is not allowed")
		return nil, l.errs
	} else if !errors.Is(err, io.EOF) {
		l.syntaxError(data, err)
		return nil, l.errs
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		l.errorf(root, "", "start the file with: version: 1", "the configuration must be a mapping of sections, not a %s", kindName(root))
		return nil, l.errs
	}

	// Anchors and aliases are refused before anything follows an alias:
	// the walk below and yaml's own decoding would expand every one of
	// them, which a small file can make quadratic.
	if l.refuseAliases(root); len(l.errs) > 0 {
		return nil, l.errs
	}
	l.check(root, reflect.TypeOf(Config{}), "")
	if len(l.errs) > 0 {
		return nil, l.errs
	}
	c := &Config{}
	if err := root.Decode(c); err != nil {
		// check has already refused everything yaml would; keep the file name.
		l.errorf(root, "", "", "%v", err)
		return nil, l.errs
	}
	c.Path = abs
	if abs == "" {
		c.Path = name
	}
	c.Digest = digest.Bytes(data)
	c.name, c.root = name, root
	c.pos = map[string]position{}
	for _, k := range [][2]string{{"server", "listen"}, {"admin", "listen"}} {
		if n := valueNode(valueNode(root, k[0]), k[1]); n != nil {
			c.pos[k[0]+"."+k[1]] = position{n.Line, n.Column}
		}
	}
	l.validate(c, root, filepath.Dir(abs))
	if len(l.errs) > 0 {
		return nil, l.errs
	}
	return c, nil
}

// refuseAliases reports every YAML anchor (&name) and alias (*name) under n.
// It never follows an alias, so it visits each node of the file once.
func (l *loader) refuseAliases(n *yaml.Node) {
	if n.Anchor != "" {
		l.errorf(n, "", "write the values out in full", "YAML anchors (&%s) are not accepted", n.Anchor)
	}
	if n.Kind == yaml.AliasNode {
		l.errorf(n, "", "write the values out in full", "YAML aliases (*%s) are not accepted", n.Value)
		return
	}
	for _, c := range n.Content {
		if len(l.errs) >= maxErrors {
			return
		}
		l.refuseAliases(c)
	}
}

// syntaxError turns a yaml parse error into an *Error at the position of
// the problem. yaml.v3's own "line N" is not that position: for most
// errors it is the line where the enclosing construct starts, counted from
// 0 (a mis-indented line 4 in a list that starts on line 3 is "line 2"),
// it is missing when that construct starts on the first line, and errors
// about a byte (a NUL, invalid UTF-8) have none. So the line is found
// here: the byte's own line and column, or else the first line at which
// the file stops being YAML (the shortest run of leading lines that fails
// with the same problem). No column is given then: yaml.v3 does not say.
func (l *loader) syntaxError(data []byte, err error) {
	msg := yamlProblem(err)
	e := &Error{File: l.file, Msg: "invalid YAML: " + msg}
	if line, col, what := badChar(data); line > 0 && isReaderProblem(msg) {
		e.Line, e.Col = line, col
		e.Msg += " (" + what + ")"
	} else {
		e.Line = syntaxLine(data, msg)
		// A tab in the indentation is the usual cause, and yaml.v3's
		// message does not say so.
		if col := indentTab(data, e.Line); col > 0 {
			e.Col, e.Hint = col, "YAML indentation must use spaces, not tabs: replace the tab with spaces"
			if msg == "found character that cannot start any token" {
				e.Msg += " (a tab)"
			}
		}
	}
	l.errs = append(l.errs, e)
}

// indentTab returns the column (1-based) of the first tab in the
// indentation of line n (1-based) of data, or 0.
func indentTab(data []byte, n int) int {
	lines := bytes.Split(data, []byte("\n"))
	if n < 1 || n > len(lines) {
		return 0
	}
	for i, b := range lines[n-1] {
		switch b {
		case ' ':
		case '\t':
			return i + 1
		default:
			return 0
		}
	}
	return 0
}

// isReaderProblem reports whether msg is one of yaml.v3's errors about the
// bytes of the file rather than its structure.
func isReaderProblem(msg string) bool {
	return msg == "control characters are not allowed" || strings.Contains(msg, "UTF-8") || msg == "invalid Unicode character"
}

// badChar finds the first character of a UTF-8 file that YAML does not
// allow (yaml.v3's reader: tab, line breaks and printable characters only)
// and returns its line and column (in characters, 1-based) and what it is.
// A file starting with a UTF-16 byte order mark is not looked at.
func badChar(data []byte) (line, col int, what string) {
	if bytes.HasPrefix(data, []byte{0xFF, 0xFE}) || bytes.HasPrefix(data, []byte{0xFE, 0xFF}) {
		return 0, 0, ""
	}
	line, col = 1, 1
	for i := 0; i < len(data); {
		r, w := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && w <= 1:
			return line, col, fmt.Sprintf("byte 0x%02x", data[i])
		case r == '\n':
			line, col = line+1, 1
		case r == '\t' || r == '\r' || r >= 0x20 && r <= 0x7E || r == 0x85 || r >= 0xA0 && r <= 0xD7FF ||
			r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF:
			col++
		default:
			return line, col, fmt.Sprintf("%U", r)
		}
		i += w
	}
	return 0, 0, ""
}

// syntaxLine returns the smallest n such that the first n lines of data
// fail to parse with problem (data as a whole does). It parses O(log n)
// prefixes.
func syntaxLine(data []byte, problem string) int {
	ends := []int{} // ends[k-1]: the end of line k, its newline included
	for i, b := range data {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(ends) == 0 || ends[len(ends)-1] != len(data) {
		ends = append(ends, len(data))
	}
	lo, hi := 1, len(ends)
	for lo < hi {
		mid := (lo + hi) / 2
		if syntaxProblem(data[:ends[mid-1]]) == problem {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// syntaxProblem is yaml.v3's message for the first syntax error in data,
// without "yaml: " and "line N: ", or "".
func syntaxProblem(data []byte) string {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return ""
		}
		if err != nil {
			return yamlProblem(err)
		}
	}
}

// yamlProblem is a yaml.v3 error's message without "yaml: " and "line N: ".
func yamlProblem(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok && n != "" && strings.Trim(n, "0123456789") == "" {
			msg = after
		}
	}
	return msg
}

// validator is implemented by every section.
type validator interface{ Validate() error }

// validate checks the settings of every section.
func (l *loader) validate(c *Config, root *yaml.Node, dir string) {
	if c.Version != Version {
		n := valueNode(root, "version")
		if n == nil {
			n = root
		}
		if c.Version == 0 {
			l.errorf(n, "version", "add the line: version: 1", "missing: the schema version is required")
		} else {
			l.errorf(n, "version", "this cmcp reads version 1", "unsupported schema version %d", c.Version)
		}
	}
	l.validateUpstreams(c, valueNode(root, "upstreams"), dir)
	// Sections with a Validate method report at the position of the value
	// the error is about (valueAt), else at their key's.
	v := reflect.ValueOf(c).Elem()
	t := v.Type()
	for i := range t.NumField() {
		name := yamlName(t.Field(i))
		if name == "" || name == "upstreams" {
			continue
		}
		f := v.Field(i)
		if f.Kind() == reflect.Pointer && f.IsNil() {
			continue
		}
		val, ok := f.Interface().(validator)
		if !ok && f.CanAddr() {
			val, ok = f.Addr().Interface().(validator)
		}
		if !ok {
			continue
		}
		if err := val.Validate(); err != nil {
			n, hint := keyNode(root, name), ""
			var pe *pathError
			if errors.As(err, &pe) {
				n, hint = nodeAt(valueNode(root, name), pe.path, n), pe.hint
			}
			field := name
			if strings.HasPrefix(err.Error(), name+".") {
				field = "" // the message names the setting
			}
			l.errorf(n, field, hint, "%v", err)
		}
	}
	l.validateAdminApart(c, root)
	l.validateCatalogUpstreams(c, root)
}

// validateCatalogUpstreams refuses pins for an upstream that is not
// configured: a misspelt name ("file" for "files") would leave the real
// upstream unpinned, running on whatever definitions it shows first. For
// the same reason it refuses an entry that says nothing (files: {}) and a
// tools key left empty: tools: {} is how to refuse every tool. An entry
// with drift: and no tools key sets the drift of an unpinned upstream,
// whose baseline is the definitions it shows first.
func (l *loader) validateCatalogUpstreams(c *Config, root *yaml.Node) {
	if c.Catalog == nil {
		return
	}
	var names []string
	for _, u := range c.Upstreams {
		names = append(names, u.Name)
	}
	entries := valueNode(valueNode(root, "catalog"), "upstreams")
	for _, name := range slices.Sorted(maps.Keys(c.Catalog.Upstreams)) {
		if slices.Contains(names, name) {
			// An entry pins its upstream's tools, or sets its drift: a
			// tools key with nothing after it (a placeholder pasted
			// empty) or an entry with no key at all would pin nothing,
			// and the upstream would run on whatever definitions it
			// shows first, while tools: {} refuses every tool. Neither is
			// what it looks like.
			e := c.Catalog.Upstreams[name]
			if e.Tools == nil {
				hint := fmt.Sprintf("paste the output of cmcp spawn-digest --tools for %s under tools:; write tools: {} to refuse every tool of %s; "+
					"or remove the entry, or leave only its drift:, to run %s without tool pins (the definitions it shows first in a run are its baseline)", name, name, name)
				if k := keyNode(valueNode(entries, name), "tools"); k != nil && k.Kind == yaml.ScalarNode && k.Value == "tools" {
					l.errorf(k, "catalog.upstreams."+name+".tools", hint, "is empty, so it pins nothing: %s would run on whatever tool definitions it shows first", name)
				} else if e.Drift == "" {
					l.errorf(keyNode(entries, name), "catalog.upstreams."+name, hint, "has no tools: key, so it pins nothing: %s would run on whatever tool definitions it shows first", name)
				}
			}
			continue
		}
		hint := "no upstream is configured: add it under upstreams, or remove its catalog entry"
		if len(names) > 0 {
			hint = "the configured upstreams are: " + strings.Join(names, ", ")
			best, bestD := "", 3
			for _, n := range names {
				if d := editDistance(name, n); d < bestD {
					best, bestD = n, d
				}
			}
			if best != "" {
				hint = fmt.Sprintf("did you mean %q? %s", best, hint)
			}
		}
		l.errorf(keyNode(entries, name), "catalog.upstreams."+name, hint, "no upstream named %q is configured, so these pins would pin nothing", name)
	}
}

// pathError is an error of a section's Validate about one value in it:
// path leads from the section's node to the value, so that Load reports
// the value's line rather than the section's.
type pathError struct {
	path valuePath
	err  error
	hint string // what to do, if there is something to say
}

func (e *pathError) Error() string { return e.err.Error() }
func (e *pathError) Unwrap() error { return e.err }

// valuePath is the way from a node to a value in it: a string is the value
// of that key in a mapping, a keyOf the key itself, an int an item of a
// list.
type valuePath []any

// keyOf in a valuePath is a key itself, for an error about the key.
type keyOf string

// valueAt starts an error about the value at path in a section.
func valueAt(path ...any) valuePath { return path }

func (p valuePath) errorf(format string, args ...any) error {
	return &pathError{path: p, err: fmt.Errorf(format, args...)}
}

// hintf is errorf with a hint: what to do about it.
func (p valuePath) hintf(hint, format string, args ...any) error {
	return &pathError{path: p, err: fmt.Errorf(format, args...), hint: hint}
}

// nodeAt follows path from n as far as the nodes go and returns the last
// node reached, or fallback when n is nil.
func nodeAt(n *yaml.Node, path valuePath, fallback *yaml.Node) *yaml.Node {
	if n == nil {
		return fallback
	}
	for _, step := range path {
		for n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		var next *yaml.Node
		switch step := step.(type) {
		case string:
			next = valueNode(n, step)
		case keyOf:
			if k := keyNode(n, string(step)); k != n {
				next = k
			}
		case int:
			if n.Kind == yaml.SequenceNode && step >= 0 && step < len(n.Content) {
				next = n.Content[step]
			}
		}
		if next == nil {
			break
		}
		n = next
	}
	return n
}

// validateAdminApart keeps agents off the admin listener: its token may not
// be an agent's bearer token, and it may not share the agents' address.
func (l *loader) validateAdminApart(c *Config, root *yaml.Node) {
	if c.Admin == nil || c.Admin.TokenSHA256.IsZero() {
		return
	}
	n := keyNode(valueNode(root, "admin"), "token_sha256")
	if c.Server != nil {
		for i, t := range c.Server.Tokens {
			if !t.SHA256.IsZero() && t.SHA256.Equal(c.Admin.TokenSHA256) {
				l.errorf(n, "admin.token_sha256", "generate a separate admin token: ADMIN_TOKEN=$(head -c 32 /dev/urandom | base64); printf %s \"$ADMIN_TOKEN\" | sha256sum",
					"is the digest of server.tokens[%d] (agent %q): that agent could reach the admin listener", i, t.Identity)
			}
		}
	}
	// CheckListeners compares the addresses as resolved, after --listen;
	// here, without resolving names, localhost is 127.0.0.1 and a wildcard
	// address takes its port on every address.
	if c.Admin.Listen != "" && sameListenerLiteral(c.Admin.Listen, c.Server.ListenOrDefault()) {
		l.errorf(valueNode(valueNode(root, "admin"), "listen"), "admin.listen", "give the admin listener its own port, e.g. 127.0.0.1:9090",
			"%s is also server.listen (%s): the admin listener needs its own address", c.Admin.Listen, listenSource(c.Server))
	}
}

// listenSource is server.listen, or the default address and that it is.
func listenSource(s *Server) string {
	if s == nil || s.Listen == "" {
		return DefaultListen + ", the default"
	}
	return s.Listen
}

// keyNode returns the key node of name in the mapping m, or m.
func keyNode(m *yaml.Node, name string) *yaml.Node {
	for i := 0; m != nil && m.Kind == yaml.MappingNode && i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == name {
			return m.Content[i]
		}
	}
	return m
}

// valueNode returns the value node of name in the mapping m, or nil.
func valueNode(m *yaml.Node, name string) *yaml.Node {
	for i := 0; m != nil && m.Kind == yaml.MappingNode && i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == name {
			return m.Content[i+1]
		}
	}
	return nil
}

var (
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	yamlUnmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
)

// check walks the YAML node n against the Go type t and reports, with their
// positions, unknown and duplicate keys, YAML features cmcp does not accept,
// and values that do not decode into their field.
func (l *loader) check(n *yaml.Node, t reflect.Type, field string) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Tag == "!!null" {
		return // an empty value leaves the default
	}
	pt := reflect.PointerTo(t)
	switch {
	case pt.Implements(yamlUnmarshalerType):
		l.decodeInto(n, t, field)
		return
	case pt.Implements(textUnmarshalerType):
		if n.Kind != yaml.ScalarNode {
			l.errorf(n, field, "", "want a single value, got a %s", kindName(n))
			return
		}
		l.decodeInto(n, t, field)
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		l.checkStruct(n, t, field)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			l.errorf(n, field, "", "want a mapping, got a %s", kindName(n))
			return
		}
		seen := map[string]*yaml.Node{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" {
				l.errorf(k, field, "write the entries out in full", "YAML merge keys (<<) are not accepted")
				continue
			}
			if prev, dup := seen[k.Value]; dup {
				l.errorf(k, join(field, k.Value), "remove one of them", "duplicate key (first at line %d)", prev.Line)
				continue
			}
			seen[k.Value] = k
			l.decodeInto(k, t.Key(), field)
			l.check(v, t.Elem(), join(field, k.Value))
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			l.errorf(n, field, "", "want a list, got a %s", kindName(n))
			return
		}
		for i, item := range n.Content {
			l.check(item, t.Elem(), fmt.Sprintf("%s[%d]", field, i))
		}
	default:
		if n.Kind != yaml.ScalarNode {
			l.errorf(n, field, "", "want a single value, got a %s", kindName(n))
			return
		}
		l.decodeInto(n, t, field)
	}
}

// checkStruct checks the mapping n against the settings of struct type t:
// every key known, none twice, no merge keys, each value checked.
func (l *loader) checkStruct(n *yaml.Node, t reflect.Type, field string) {
	if n.Kind != yaml.MappingNode {
		l.errorf(n, field, "", "want a mapping of settings, got a %s", kindName(n))
		return
	}
	fields := map[string]reflect.StructField{}
	var known []string
	for i := range t.NumField() {
		f := t.Field(i)
		if name := yamlName(f); name != "" {
			fields[name] = f
			known = append(known, name)
		}
	}
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		sub := join(field, k.Value)
		if k.Value == "<<" {
			l.errorf(k, field, "write the settings out in full", "YAML merge keys (<<) are not accepted")
			continue
		}
		if prev, dup := seen[k.Value]; dup {
			l.errorf(k, sub, "remove one of them", "duplicate key (first at line %d)", prev.Line)
			continue
		}
		seen[k.Value] = k
		f, ok := fields[k.Value]
		if !ok {
			where := "at the top level"
			if field != "" {
				where = "in " + field
			}
			l.errorf(k, "", suggest(k.Value, known), "unknown key %q %s", k.Value, where)
			continue
		}
		l.check(v, f.Type, sub)
	}
}

// decodeInto decodes n into a new value of type t and reports a failure at
// n's position.
func (l *loader) decodeInto(n *yaml.Node, t reflect.Type, field string) {
	if t.Kind() == reflect.Bool && n.Tag != "!!bool" {
		// yaml.v3 would read yes/no/on/off into a bool; cmcp wants it spelled out.
		l.errorf(n, field, "", "%q: want true or false", n.Value)
		return
	}
	v := reflect.New(t)
	if err := n.Decode(v.Interface()); err != nil {
		msg := err.Error()
		var te *yaml.TypeError
		if errors.As(err, &te) && len(te.Errors) > 0 {
			msg = te.Errors[0]
			if _, after, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(msg, "line ") {
				msg = after
			}
		}
		msg = strings.TrimPrefix(msg, "yaml: ")
		l.errorf(n, field, decodeHint(n, t), "%s", msg)
	}
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	digestType   = reflect.TypeFor[digest.Digest]()
	// hex64RE is 64 hex digits, the count checked apart (decodeHint).
	hex64RE = regexp.MustCompile(`^(?:sha256:)?([0-9a-fA-F]+)$`)
)

// decodeHint says what to write for a value of type t that n does not
// decode into, when the mistake is a common one: a number of seconds for a
// duration, a digest as sha256sum prints it.
func decodeHint(n *yaml.Node, t reflect.Type) string {
	switch t {
	case durationType:
		return "write a duration with a unit, e.g. 30s or 5m"
	case digestType:
		v := strings.TrimSpace(n.Value)
		first, _, _ := strings.Cut(v, " ")
		m := hex64RE.FindStringSubmatch(first)
		if m == nil || len(m[1]) != 64 {
			break
		}
		sum := digest.Prefix + strings.ToLower(m[1])
		if rest := v[len(first):]; rest != "" {
			return fmt.Sprintf("drop the trailing %q (the file name sha256sum prints) and write %s", rest, sum)
		}
		return fmt.Sprintf("write %s: a digest starts with its algorithm", sum)
	}
	return ""
}

// yamlName is the key of a struct field in YAML ("" for skipped fields).
func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	tag := f.Tag.Get("yaml")
	name, _, _ := strings.Cut(tag, ",")
	if name == "-" {
		return ""
	}
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}

func join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.ScalarNode:
		return "single value"
	case yaml.AliasNode:
		return "alias"
	}
	return "document"
}

// suggest names the known key closest to k, or lists the known keys.
func suggest(k string, known []string) string {
	best, bestD := "", 3
	for _, c := range known {
		if d := editDistance(strings.ToLower(k), c); d < bestD {
			best, bestD = c, d
		}
	}
	if best != "" {
		return fmt.Sprintf("did you mean %q? known keys here: %s", best, strings.Join(known, ", "))
	}
	return "known keys here: " + strings.Join(known, ", ")
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
