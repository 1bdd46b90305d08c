package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/ui"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/excerpt"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/rogpeppe/go-internal/txtar"
	"go.yaml.in/yaml/v3"
)

var updateSchemas = flag.Bool("update-schemas", false, "write docs/schema/*.schema.json from the Go types")

// schemaDir is absolute: tests change the working directory.
var schemaDir = func() string {
	d, err := filepath.Abs(filepath.Join("..", "..", "docs", "schema"))
	if err != nil {
		panic(err)
	}
	return d
}()

// schemaDoc is one published schema: a document cmcp writes or reads.
type schemaDoc struct {
	name, title, description string
	build                    func() (*schemaGen, map[string]any)
}

// jsonDoc is the schema of a JSON document of Go type t.
func jsonDoc(t reflect.Type, versioned bool) func() (*schemaGen, map[string]any) {
	return func() (*schemaGen, map[string]any) {
		g := newSchemaGen("json")
		s := g.object(t, "")
		if versioned {
			s["properties"].(map[string]any)["schema_version"] = map[string]any{"const": ui.SchemaVersion}
		}
		return g, s
	}
}

// jsonDocs is the schema of a JSON document of one of the Go types ts
// (versioned: each has schema_version).
func jsonDocs(ts ...reflect.Type) func() (*schemaGen, map[string]any) {
	return func() (*schemaGen, map[string]any) {
		g := newSchemaGen("json")
		var alts []any
		for _, t := range ts {
			s := g.object(t, "")
			s["properties"].(map[string]any)["schema_version"] = map[string]any{"const": ui.SchemaVersion}
			alts = append(alts, s)
		}
		if len(alts) == 1 {
			return g, alts[0].(map[string]any)
		}
		return g, map[string]any{"anyOf": alts}
	}
}

// auditKinds are the record kinds and their bodies. A kind added to
// pkg/auditlog/record/records.go must be added here (TestSchemasMatchTheGoTypes).
var auditKinds = []record.Record{
	&record.Genesis{}, &record.Segment{}, &record.CheckpointRecord{}, &record.Recovery{}, &record.Seal{},
	&record.Spawn{}, &record.Upstream{}, &record.Drift{}, &record.Session{}, &record.Call{},
	&record.Access{}, &record.Result{}, &record.Stderr{}, &record.Policy{}, &record.Admin{},
	&record.CredentialMinted{}, &record.Machine{},
}

func auditRecordSchema() (*schemaGen, map[string]any) {
	g := newSchemaGen("json")
	var kinds []any
	var cases []any
	for _, r := range auditKinds {
		kinds = append(kinds, string(r.Kind()))
		cases = append(cases, map[string]any{
			"if":   map[string]any{"properties": map[string]any{"kind": map[string]any{"const": string(r.Kind())}}},
			"then": map[string]any{"properties": map[string]any{"body": g.schema(reflect.TypeOf(r).Elem(), false, "")}},
		})
	}
	s := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"v":    map[string]any{"const": 1, "description": "format version"},
			"kind": map[string]any{"enum": kinds, "description": "record kind: says which body follows"},
			"seq":  map[string]any{"type": "string", "pattern": decimalPattern, "description": "record index in the epoch, from 0, without gaps"},
			"prev": map[string]any{"type": "string", "pattern": `^[A-Za-z0-9+/]{43}=$`, "description": "base64 of the leaf hash of the previous record (32 zero bytes for the genesis record)"},
			"ts":   map[string]any{"type": "string", "format": "date-time", "description": "RFC 3339 UTC time with nanoseconds; absent in checkpoint records"},
			"body": map[string]any{"type": "object", "description": "the kind-specific record"},
		},
		"required":             []any{"v", "kind", "seq", "prev", "body"},
		"additionalProperties": false,
		"allOf":                cases,
	}
	return g, s
}

// configSchema is cmcp.yaml's: the keys internal/config reads, described
// by docs/configuration.md's rows.
func configSchema(t testing.TB) func() (*schemaGen, map[string]any) {
	return func() (*schemaGen, map[string]any) {
		rows := map[string]string{}
		b, err := os.ReadFile("../../docs/configuration.md")
		if err != nil {
			t.Fatal(err)
		}
		row := regexp.MustCompile("^\\| `([a-z0-9_.<>]+)` \\|([^|]*)\\|(.*)\\|$")
		for _, l := range strings.Split(string(b), "\n") {
			if m := row.FindStringSubmatch(strings.ReplaceAll(l, `\|`, "¦")); m != nil {
				d := strings.ReplaceAll(strings.TrimSpace(m[3]), "¦", "|")
				if def := strings.ReplaceAll(strings.TrimSpace(m[2]), "¦", "|"); def != "" {
					d = strings.TrimSpace(d + " (default: " + def + ")")
				}
				rows[m[1]] = d
			}
		}
		g := newSchemaGen("yaml")
		g.describe = func(path string) string { return rows[path] }
		s := g.object(reflect.TypeFor[config.Config](), "")
		s["required"] = []any{"version"}
		s["properties"].(map[string]any)["version"] = map[string]any{"const": 1, "description": rows["version"]}
		return g, s
	}
}

func schemaDocs(t testing.TB) []schemaDoc {
	return []schemaDoc{
		{"config", "cmcp.yaml", "The configuration cmcp serve, spawn-digest --check and connect read (YAML; this schema describes it as JSON). Reference: docs/configuration.md.", configSchema(t)},
		{"audit-record", "cmcp audit record", "One line of an audit log segment (pkg/auditlog/FORMAT.md): the envelope and, by kind, its body. The line must also be in RFC 8785 canonical form, which a schema cannot say.", auditRecordSchema},
		{"session-receipt", "cmcp session receipt", "What cmcp verify-chain --make-receipt writes and --receipt checks (docs/auditor.md).", jsonDoc(reflect.TypeFor[excerpt.SessionReceipt](), false)},
		{"evidence-bundle", "cmcp evidence bundle", "What cmcp attest --out writes and attest verify and verify-chain read (docs/attest.md).", jsonDoc(reflect.TypeFor[evidence.Bundle](), false)},
		{"verify-chain", "cmcp verify-chain --output json", "The result of cmcp verify-chain DIR -o json, verified or failed (docs/verify-chain.md).", jsonDoc(reflect.TypeFor[verifyChainDoc](), true)},
		{"verify-chain-prove", "cmcp verify-chain --prove --output json", "The inclusion proof cmcp verify-chain DIR --prove N -o json prints (docs/verify-chain.md).", jsonDocs(reflect.TypeFor[proveDoc]())},
		{"verify-chain-proof", "cmcp verify-chain --proof --output json", "The result of cmcp verify-chain --proof FILE -o json: verified, or failed (docs/verify-chain.md).", jsonDocs(reflect.TypeFor[proofDoc](), reflect.TypeFor[failedDoc]())},
		{"verify-chain-segment", "cmcp verify-chain --segment --output json", "The result of cmcp verify-chain --segment FILE -o json (docs/verify-chain.md).", jsonDocs(reflect.TypeFor[segmentDoc](), reflect.TypeFor[failedDoc]())},
		{"verify-chain-receipt", "cmcp verify-chain --receipt --output json", "The result of cmcp verify-chain --receipt FILE -o json: verified, or failed (docs/auditor.md).", jsonDocs(reflect.TypeFor[receiptCheckDoc](), reflect.TypeFor[failedDoc]())},
		{"verify-chain-fleet", "cmcp verify-chain DIR DIR... --output json", "The result of cmcp verify-chain on several audit directories (a fleet) -o json (docs/fleet.md).", jsonDocs(reflect.TypeFor[fleetDoc]())},
		{"replay", "cmcp replay --output json", "The result of cmcp replay -o json (docs/policy-and-replay.md).", jsonDoc(reflect.TypeFor[replayDoc](), true)},
		{"spawn-digest", "cmcp spawn-digest --output json", "The measurement cmcp spawn-digest -o json prints (docs/spawn-digest.md).", jsonDoc(reflect.TypeFor[spawnDigestDoc](), true)},
		{"spawn-digest-check", "cmcp spawn-digest --check --output json", "The pin check cmcp spawn-digest --check -o json prints (docs/spawn-digest.md).", jsonDoc(reflect.TypeFor[spawnCheckDoc](), true)},
		{"attest", "cmcp attest --output json", "What cmcp attest -o json prints about the evidence it wrote (docs/attest.md).", jsonDoc(reflect.TypeFor[attestDoc](), true)},
		{"attest-verify", "cmcp attest verify --output json", "The appraisal cmcp attest verify -o json prints (docs/attest.md).", jsonDoc(reflect.TypeFor[verifyDoc](), true)},
		{"version", "cmcp version --output json", "What cmcp version -o json prints.", jsonDoc(reflect.TypeFor[versionDoc](), true)},
	}
}

// generateSchema renders d as published.
func generateSchema(d schemaDoc) ([]byte, []string) {
	g, s := d.build()
	doc := map[string]any{
		"$schema":     "https://json-schema.org/draft/2020-12/schema",
		"$id":         "https://github.com/confidential-mcp/cmcp/blob/main/docs/schema/" + d.name + ".schema.json",
		"title":       d.title,
		"description": d.description,
	}
	for k, v := range s {
		doc[k] = v
	}
	if len(g.defs) > 0 {
		doc["$defs"] = g.defs
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, []string{err.Error()}
	}
	return append(b, '\n'), g.errs
}

// TestSchemasMatchTheGoTypes: every schema in docs/schema is what the Go
// types of its document give today (members, their types, which are always
// there), so a member added, renamed or removed in Go fails this test until
// the schema is made again:
//
//	go test ./internal/cli -run TestSchemasMatchTheGoTypes -update-schemas
//
// Descriptions are not compared (the config schema's come from
// docs/configuration.md). Every record kind of pkg/auditlog/record/records.go has
// its body in the audit record schema, and docs/schema holds no other
// schema.
func TestSchemasMatchTheGoTypes(t *testing.T) {
	var names []string
	for _, d := range schemaDocs(t) {
		names = append(names, d.name+".schema.json")
		got, errs := generateSchema(d)
		for _, e := range errs {
			t.Errorf("%s: %s", d.name, e)
		}
		file := filepath.Join(schemaDir, d.name+".schema.json")
		if *updateSchemas {
			if err := os.WriteFile(file, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(file)
		if err != nil || !sameSchema(got, want) {
			t.Errorf("%s does not match the Go types (%v): make it again with go test ./internal/cli -run TestSchemasMatchTheGoTypes -update-schemas", file, err)
		}
		var s jsonschema.Schema
		if err := json.Unmarshal(got, &s); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if _, err := s.Resolve(nil); err != nil {
			t.Errorf("%s does not resolve: %v", file, err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(schemaDir, "*.json"))
	for _, f := range files {
		if !slices.Contains(names, filepath.Base(f)) {
			t.Errorf("%s: no Go type makes it", f)
		}
	}
	src, err := os.ReadFile("../../pkg/auditlog/record/records.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s+Kind\w+\s+Kind = "([a-z_]+)"`).FindAllStringSubmatch(string(src), -1) {
		if !slices.ContainsFunc(auditKinds, func(r record.Record) bool { return string(r.Kind()) == m[1] }) {
			t.Errorf("record kind %q is not in auditKinds (schema_test.go): add its body type", m[1])
		}
	}
}

// sameSchema compares two schemas but for their descriptions (which come
// from the docs, not the types: a reworded doc need not fail the test).
func sameSchema(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(dropDescriptions(x), dropDescriptions(y))
}

func dropDescriptions(v any) any {
	switch v := v.(type) {
	case map[string]any:
		delete(v, "description")
		for k, e := range v {
			v[k] = dropDescriptions(e)
		}
	case []any:
		for i, e := range v {
			v[i] = dropDescriptions(e)
		}
	}
	return v
}

var (
	schemaMu       sync.Mutex
	schemaResolved = map[string]*jsonschema.Resolved{}
)

// validateJSON checks data (one JSON document) against docs/schema/NAME.schema.json.
func validateJSON(name string, data []byte) error {
	schemaMu.Lock()
	rs := schemaResolved[name]
	if rs == nil {
		b, err := os.ReadFile(filepath.Join(schemaDir, name+".schema.json"))
		if err != nil {
			schemaMu.Unlock()
			return err
		}
		var s jsonschema.Schema
		if err := json.Unmarshal(b, &s); err != nil {
			schemaMu.Unlock()
			return fmt.Errorf("%s.schema.json: %w", name, err)
		}
		if rs, err = s.Resolve(nil); err != nil {
			schemaMu.Unlock()
			return fmt.Errorf("%s.schema.json: %w", name, err)
		}
		schemaResolved[name] = rs
	}
	schemaMu.Unlock()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("not JSON for %s.schema.json: %w", name, err)
	}
	if err := rs.Validate(v); err != nil {
		return fmt.Errorf("%s.schema.json: %w\n%s", name, err, clipSchema(data))
	}
	return nil
}

func clipSchema(b []byte) string {
	if len(b) > 3000 {
		return string(b[:3000]) + "..."
	}
	return string(b)
}

// validateAuditLog checks every record line of every segment in dir against
// the audit record schema, and says how many of each kind it saw.
func validateAuditLog(t testing.TB, dir string) map[string]int {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "epoch-*", "seg-*.jsonl"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segments in %s (%v)", dir, err)
	}
	kinds := map[string]int{}
	for _, seg := range segs {
		f, err := os.Open(seg)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 16<<20)
		for n := 1; sc.Scan(); n++ {
			if err := validateJSON("audit-record", sc.Bytes()); err != nil {
				t.Errorf("%s:%d: %v", seg, n, err)
			}
			var l struct{ Kind string }
			json.Unmarshal(sc.Bytes(), &l)
			kinds[l.Kind]++
		}
		f.Close()
	}
	return kinds
}

// jsonOutputSchema names the schema of what cmcp ARGS prints on stdout,
// or "" when it prints no document with a published schema.
func jsonOutputSchema(args []string) string {
	jsonOut := false
	var words []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			i = len(args)
		case a == "-o" || a == "--output":
			if i+1 < len(args) && args[i+1] == "json" {
				jsonOut = true
			}
			i++
		case a == "-ojson" || a == "--output=json" || a == "-o=json":
			jsonOut = true
		case !strings.HasPrefix(a, "-"):
			words = append(words, a)
		}
	}
	has := func(flags ...string) bool {
		return slices.ContainsFunc(args, func(a string) bool {
			return slices.ContainsFunc(flags, func(f string) bool { return a == f || strings.HasPrefix(a, f+"=") })
		})
	}
	if len(words) == 0 {
		return ""
	}
	switch words[0] {
	case "verify-chain":
		if has("--make-receipt") {
			return "session-receipt"
		}
		switch {
		case !jsonOut:
			return ""
		case has("--prove"):
			return "verify-chain-prove"
		case has("--proof"):
			return "verify-chain-proof"
		case has("--segment"):
			return "verify-chain-segment"
		case has("--receipt"):
			return "verify-chain-receipt"
		}
		return "verify-chain"
	case "replay":
		if jsonOut {
			return "replay"
		}
	case "spawn-digest":
		if jsonOut && has("--check") {
			return "spawn-digest-check"
		}
		if jsonOut {
			return "spawn-digest"
		}
	case "attest":
		if jsonOut && len(words) > 1 && words[1] == "verify" {
			return "attest-verify"
		}
		if jsonOut {
			return "attest"
		}
	case "version":
		if jsonOut {
			return "version"
		}
	}
	return ""
}

// checkJSONOutput validates what cmcp ARGS printed on stdout against its
// published schema, if it has one (the CLI tests' helpers call it).
func checkJSONOutput(args []string, stdout []byte) error {
	name := jsonOutputSchema(args)
	if name == "" || len(bytes.TrimSpace(stdout)) == 0 {
		return nil
	}
	if name == "verify-chain" && bytes.Contains(stdout, []byte(`"gateways":`)) {
		name = "verify-chain-fleet" // several directories
	}
	if err := validateJSON(name, stdout); err != nil {
		return fmt.Errorf("cmcp %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// checkWrittenFiles validates the documents cmcp ARGS wrote (run in dir),
// when it exited 0: attest's evidence bundle (--out, -O).
func checkWrittenFiles(args []string, dir string, code int) error {
	if code != 0 || len(args) == 0 {
		return nil
	}
	var words []string
	out := "cmcp-evidence.json"
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			i = len(args)
		case a == "--out" || a == "-O":
			if i+1 < len(args) {
				out = args[i+1]
			}
			i++
		case strings.HasPrefix(a, "--out="):
			out = strings.TrimPrefix(a, "--out=")
		case a == "-o" || a == "--output" || a == "--provider" || a == "--nonce" || a == "--key" || a == "--key-out" || a == "--statement" || a == "--nonce-file" || a == "--cert":
			i++
		case !strings.HasPrefix(a, "-"):
			words = append(words, a)
		}
	}
	if len(words) != 1 || words[0] != "attest" || out == "-" {
		return nil
	}
	if !filepath.IsAbs(out) {
		out = filepath.Join(dir, out)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return fmt.Errorf("cmcp %s: %w", strings.Join(args, " "), err)
	}
	if err := validateJSON("evidence-bundle", b); err != nil {
		return fmt.Errorf("cmcp %s wrote %s: %w", strings.Join(args, " "), out, err)
	}
	return nil
}

// schemaFailures are what run (which has no *testing.T) found; the test
// binary fails with them (cleanupM.Run).
var (
	schemaFailuresMu sync.Mutex
	schemaFailures   []string
)

func noteSchemaFailure(err error) {
	if err == nil {
		return
	}
	schemaFailuresMu.Lock()
	schemaFailures = append(schemaFailures, err.Error())
	schemaFailuresMu.Unlock()
}

// yamlToJSON is a YAML document as the JSON the config schema describes.
func yamlToJSON(data []byte) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// TestConfigsMatchTheConfigSchema: every configuration cmcp accepts in the
// repository (examples/cmcp.yaml, the *.yaml files of the test scripts, the
// yaml blocks of docs/*.md) matches config.schema.json; and what the schema
// refuses for its keys and types (an unknown key, a string for a number,
// a second version) internal/config refuses too.
func TestConfigsMatchTheConfigSchema(t *testing.T) {
	type cfg struct {
		name string
		data []byte
	}
	var cfgs []cfg
	if b, err := os.ReadFile("../../examples/cmcp.yaml"); err == nil {
		cfgs = append(cfgs, cfg{"examples/cmcp.yaml", b})
	} else {
		t.Fatal(err)
	}
	scripts, _ := filepath.Glob("../../testdata/script/*.txtar")
	for _, s := range scripts {
		a, err := txtar.ParseFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range a.Files {
			if strings.HasSuffix(f.Name, ".yaml") {
				cfgs = append(cfgs, cfg{filepath.Base(s) + ":" + f.Name, f.Data})
			}
		}
	}
	docs, _ := filepath.Glob("../../docs/*.md")
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	for _, d := range docs {
		b, _ := os.ReadFile(d)
		for i, m := range block.FindAllSubmatch(b, -1) {
			cfgs = append(cfgs, cfg{fmt.Sprintf("%s block %d", filepath.Base(d), i+1), m[1]})
		}
	}
	accepted := 0
	for _, c := range cfgs {
		if _, err := config.LoadBytes(c.name, c.data); err != nil {
			continue // a configuration the test means to be refused, or a fragment
		}
		accepted++
		j, err := yamlToJSON(c.data)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if err := validateJSON("config", j); err != nil {
			t.Errorf("%s, which cmcp accepts: %v", c.name, err)
		}
	}
	t.Logf("%d of %d configurations accepted by internal/config, and checked", accepted, len(cfgs))
	if accepted < 10 {
		t.Fatalf("only %d of %d configurations were accepted by internal/config: the test checks too little", accepted, len(cfgs))
	}
	base := "version: 1\naudit:\n  dir: audit\nupstreams:\n  - name: t\n    stdio:\n      command: /bin/true\n    allow_unmeasured: true\n"
	if _, err := config.LoadBytes("base.yaml", []byte(base)); err != nil {
		t.Fatalf("base configuration: %v", err)
	}
	for _, bad := range []string{
		base + "unknown_key: 1\n",
		strings.Replace(base, "version: 1", "version: 2", 1),
		base + "server:\n  max_sessions: many\n",
		base + "server:\n  listen: [1, 2]\n",
		strings.Replace(base, "    allow_unmeasured: true\n", "    allow_unmeasured: true\n    stdio_extra: x\n", 1),
	} {
		_, loadErr := config.LoadBytes("bad.yaml", []byte(bad))
		j, _ := yamlToJSON([]byte(bad))
		if schemaErr := validateJSON("config", j); schemaErr == nil || loadErr == nil {
			t.Errorf("schema: %v; internal/config: %v; want both to refuse\n%s", schemaErr, loadErr, bad)
		}
	}
}

// TestRecordSchemaRefusesWhatTheFormatRefuses: the records of the
// repository's fixture log match audit-record.schema.json, and the schema
// refuses a body with an unknown member, a missing one, an unknown kind and
// an envelope member the format does not have.
func TestRecordSchemaRefusesWhatTheFormatRefuses(t *testing.T) {
	kinds := validateAuditLog(t, "../../testdata/auditlog/log")
	if kinds["genesis"] == 0 || kinds["call"] == 0 || kinds["checkpoint"] == 0 {
		t.Fatalf("the fixture log holds too few kinds: %v", kinds)
	}
	segs, _ := filepath.Glob("../../testdata/auditlog/log/epoch-*/seg-*.jsonl")
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	var call []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(l, []byte(`"kind":"call"`)) {
			call = l
			break
		}
	}
	if call == nil {
		t.Fatal("no call record in the fixture's first segment")
	}
	for _, tc := range []struct{ name, old, new string }{
		{"unknown body member", `"body":{`, `"body":{"aaa":"x",`},
		{"missing body member", `"decision":"`, `"decisionx":"`},
		{"unknown kind", `"kind":"call"`, `"kind":"calls"`},
		{"unknown envelope member", `"kind":"call"`, `"kind":"call","extra":1`},
		{"seq not a decimal string", `"seq":"`, `"seq":"x`},
	} {
		bad := bytes.Replace(call, []byte(tc.old), []byte(tc.new), 1)
		if bytes.Equal(bad, call) {
			t.Fatalf("%s: %q is not in %s", tc.name, tc.old, call)
		}
		if err := validateJSON("audit-record", bad); err == nil {
			t.Errorf("%s: the schema accepts %s", tc.name, bad)
		}
	}
}
