package cmcp_test

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// listedPackage is the part of `go list -json` these tests read.
type listedPackage struct {
	ImportPath string
	Name       string
	Dir        string
	GoFiles    []string
	CgoFiles   []string
	Imports    []string
	Deps       []string
}

// goList runs `go list -json` over patterns.
func goList(t *testing.T, args ...string) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list %v listed no packages", args)
	}
	return pkgs
}

// TestOfflinePackagesDoNotImportNetHTTP: everything under pkg/ (the
// libraries outside verifiers import: digest, framing, auditlog, evidence)
// works offline, so none of it may depend on net/http, directly or not.
func TestOfflinePackagesDoNotImportNetHTTP(t *testing.T) {
	for _, p := range goList(t, "./pkg/...") {
		if slices.Contains(p.Deps, "net/http") {
			t.Errorf("%s depends on net/http (see `go list -deps %s`); offline packages must not", p.ImportPath, p.ImportPath)
		}
	}
}

// TestPackageDocComments: every package of the module has exactly one
// package doc comment, "// Package <name> ..." ("// Command <name> ..." for
// a main package), in one of its non-test files.
func TestPackageDocComments(t *testing.T) {
	fset := token.NewFileSet()
	for _, p := range goList(t, "./...") {
		if len(p.GoFiles)+len(p.CgoFiles) == 0 {
			continue // tests only, like this one
		}
		var withDoc []string
		for _, name := range slices.Concat(p.GoFiles, p.CgoFiles) {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if f.Doc == nil {
				continue
			}
			withDoc = append(withDoc, name)
			text := f.Doc.Text()
			want := "Package " + p.Name + " "
			if p.Name == "main" {
				want = "Command "
			}
			if !strings.HasPrefix(text, want) {
				t.Errorf("%s: %s: the package doc comment should start %q, it starts %q", p.ImportPath, name, want, firstLine(text))
			}
		}
		switch len(withDoc) {
		case 0:
			t.Errorf("%s has no package doc comment: add \"// Package %s ...\" above the package clause of one file (doc.go or the main file)", p.ImportPath, p.Name)
		case 1:
		default:
			t.Errorf("%s has %d package doc comments (%s): keep exactly one", p.ImportPath, len(withDoc), strings.Join(withDoc, ", "))
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// TestOnlyTheServerAssemblyReadsConfig: of the packages `cmcp serve` runs
// (internal/server and what it depends on), only the server assembly
// imports internal/config: it turns the file into plain option structs
// for the gateway core, its fronts and the upstreams, so that the core's
// behaviour follows from its options and not from where a setting sits
// in cmcp.yaml. The command line (internal/cli) loads the file for every
// verb and is not among them.
func TestOnlyTheServerAssemblyReadsConfig(t *testing.T) {
	const (
		module = "github.com/confidential-mcp/cmcp/"
		config = module + "internal/config"
		server = module + "internal/server"
	)
	mayRead := map[string]string{
		server: "the server assembly",
		// Not moved yet: the HTTP upstream's options from the file
		// (HTTPOptionsFromConfig) and the rules it shares with
		// spawn-digest --check (config.Credential, RedactedURL,
		// CodeLoadingEnv, header names).
		module + "internal/upstream": "known exception",
	}
	runs := goList(t, append([]string{"-deps"}, "./internal/server")...)
	seen := 0
	for _, p := range runs {
		if !strings.HasPrefix(p.ImportPath, module) || p.ImportPath == config {
			continue
		}
		seen++
		if !slices.Contains(p.Imports, config) {
			continue
		}
		if _, ok := mayRead[p.ImportPath]; !ok {
			t.Errorf("%s imports %s; only %s may (the core and the fronts get plain option structs from it)", p.ImportPath, config, server)
		}
	}
	if seen < 5 {
		t.Fatalf("go list -deps ./internal/server listed %d of the module's packages: the check saw nothing", seen)
	}
}

// TestOnlyTheCLIRenders: the terminal renderer (lipgloss, through
// internal/ui) is the command line's business. Domain packages (config,
// policy, replay, measure, gateway, upstream, ...) report failures as
// internal/exitcode errors and never depend on the renderer, so a library
// caller or a server build does not carry it.
func TestOnlyTheCLIRenders(t *testing.T) {
	mayRender := []string{
		"github.com/confidential-mcp/cmcp/cmd/cmcp",
		"github.com/confidential-mcp/cmcp/internal/cli",
		"github.com/confidential-mcp/cmcp/internal/ui",
	}
	for _, p := range goList(t, "./...") {
		if slices.Contains(mayRender, p.ImportPath) {
			continue
		}
		for _, d := range p.Deps {
			if strings.HasPrefix(d, "charm.land/lipgloss") || d == "github.com/confidential-mcp/cmcp/internal/ui" {
				t.Errorf("%s depends on %s (see `go list -deps %s`); only %s may render: return an internal/exitcode error instead", p.ImportPath, d, p.ImportPath, strings.Join(mayRender, ", "))
				break
			}
		}
	}
}

// TestLibrariesDoNotImportInternal: pkg/ is what an outside verifier
// imports, so it must build on its own: nothing under pkg/ may depend on
// the module's internal packages.
func TestLibrariesDoNotImportInternal(t *testing.T) {
	for _, p := range goList(t, "./pkg/...") {
		for _, d := range p.Deps {
			if strings.HasPrefix(d, "github.com/confidential-mcp/cmcp/internal/") {
				t.Errorf("%s depends on %s; packages under pkg/ must not depend on internal/", p.ImportPath, d)
			}
		}
	}
}

// TestAuditlogFormatsStandAlone: pkg/auditlog/c2sp (C2SP checkpoints, note
// keys, cosignatures, proofs) and pkg/auditlog/internal/logdir (the audit
// directory's layout) sit below pkg/auditlog: they depend on no cmcp
// package but logdir, so a witness client or a checkpoint or proof check
// builds without cmcp's record format, and nothing below the audit log
// reaches up into it.
func TestAuditlogFormatsStandAlone(t *testing.T) {
	const module = "github.com/confidential-mcp/cmcp/"
	below := []string{module + "pkg/auditlog/c2sp", module + "pkg/auditlog/internal/logdir"}
	for _, p := range goList(t, below...) {
		for _, d := range p.Deps {
			if strings.HasPrefix(d, module) && d != below[1] {
				t.Errorf("%s depends on %s (see `go list -deps %s`); it must depend on no cmcp package but %s", p.ImportPath, d, p.ImportPath, below[1])
			}
		}
	}
}

// TestAuditlogScannerStandsBelow: pkg/auditlog/internal/scan (the epoch
// scanner and the Reader) and pkg/auditlog/internal/merkle (the log's
// Merkle tree) sit below pkg/auditlog: they depend on no cmcp package but
// the record format, c2sp, the directory layout and canonical JSON, never
// on auditlog itself, so the writer, Verify and the packages above
// auditlog (proofs, receipts) share one scanner.
func TestAuditlogScannerStandsBelow(t *testing.T) {
	const module = "github.com/confidential-mcp/cmcp/"
	allowed := map[string]bool{}
	for _, p := range []string{"pkg/auditlog/record", "pkg/auditlog/c2sp", "pkg/auditlog/internal/logdir", "pkg/auditlog/internal/jcs", "pkg/auditlog/internal/merkle", "pkg/digest"} {
		allowed[module+p] = true
	}
	for _, p := range goList(t, module+"pkg/auditlog/internal/scan", module+"pkg/auditlog/internal/merkle") {
		for _, d := range p.Deps {
			if strings.HasPrefix(d, module) && !allowed[d] {
				t.Errorf("%s depends on %s (see `go list -deps %s`); it must depend on no cmcp package but record, c2sp, logdir, jcs, merkle and pkg/digest (never pkg/auditlog)", p.ImportPath, d, p.ImportPath)
			}
		}
	}
}

// TestAuditlogExcerptsStandAbove: pkg/auditlog/excerpt (offline proofs,
// session receipts, the check of one segment on its own) sits above
// pkg/auditlog: it depends on no cmcp package outside pkg/auditlog but
// pkg/digest, so an auditor's tool builds without the gateway, and no
// other package under pkg/auditlog depends on it, so the writer and the
// whole-log verifier build without it. The test kit
// pkg/auditlog/internal/logtest is for tests only: no package's build
// depends on it.
func TestAuditlogExcerptsStandAbove(t *testing.T) {
	const module = "github.com/confidential-mcp/cmcp/"
	const excerpt, logtest = module + "pkg/auditlog/excerpt", module + "pkg/auditlog/internal/logtest"
	seen := false
	for _, p := range goList(t, "./...") {
		for _, d := range p.Deps {
			if d == logtest {
				t.Errorf("%s depends on %s (see `go list -deps %s`); the test kit is for tests only", p.ImportPath, d, p.ImportPath)
			}
			if d == excerpt && strings.HasPrefix(p.ImportPath, module+"pkg/auditlog") {
				t.Errorf("%s depends on %s (see `go list -deps %s`); excerpt sits above the rest of pkg/auditlog", p.ImportPath, d, p.ImportPath)
			}
			if p.ImportPath == excerpt && strings.HasPrefix(d, module) && !strings.HasPrefix(d, module+"pkg/auditlog") && d != module+"pkg/digest" {
				t.Errorf("%s depends on %s (see `go list -deps %s`); it must depend on no cmcp package outside pkg/auditlog but pkg/digest", p.ImportPath, d, p.ImportPath)
			}
		}
		seen = seen || p.ImportPath == excerpt
	}
	if !seen {
		t.Fatalf("go list ./... did not list %s: the check saw nothing", excerpt)
	}
}

// TestAuditRecordFormatStandsAlone: pkg/auditlog/record (the record kinds,
// their canonical encoding, the verification errors) sits below
// pkg/auditlog: it depends on no cmcp package but internal/jcs and
// pkg/digest, so a third party decoding audit records does not build the
// writer or the verifier.
func TestAuditRecordFormatStandsAlone(t *testing.T) {
	const module = "github.com/confidential-mcp/cmcp/"
	allowed := map[string]bool{module + "pkg/auditlog/internal/jcs": true, module + "pkg/digest": true}
	for _, p := range goList(t, module+"pkg/auditlog/record") {
		for _, d := range p.Deps {
			if strings.HasPrefix(d, module) && !allowed[d] {
				t.Errorf("%s depends on %s (see `go list -deps %s`); it must depend on no cmcp package but internal/jcs and pkg/digest", p.ImportPath, d, p.ImportPath)
			}
		}
	}
}

// TestPipelineStagesStandAlone: the stages cut out of the gateway core
// (route, decide, toagent, toollist, callwire, machines, killswitch,
// faults, toolprobe, spawnaudit) are imported by the core, which reaches them and is reached
// by them only through small interfaces. None of them depends on the
// core, the server assembly, the configuration or the command line, and
// a stage imports another stage only where listed here, so each can be
// read and tested on its own.
func TestPipelineStagesStandAlone(t *testing.T) {
	const internal = "github.com/confidential-mcp/cmcp/internal/"
	mayImport := map[string][]string{
		"route":      {"faults"},
		"decide":     {"faults", "route"}, // route.Access: what the router asks the gate
		"toagent":    {"faults"},
		"toollist":   nil,
		"callwire":   nil,
		"machines":   nil,
		"killswitch": nil,
		"faults":     nil,
		"toolprobe":  nil,
		"spawnaudit": nil,
	}
	// config only directly: internal/upstream, which several stages
	// use, still reads it (TestOnlyTheServerAssemblyReadsConfig).
	never := []string{"gateway", "server", "cli"}
	var paths []string
	for stage := range mayImport {
		paths = append(paths, "./internal/"+stage)
	}
	pkgs := goList(t, paths...)
	if len(pkgs) != len(mayImport) {
		t.Fatalf("go list listed %d of the %d stages", len(pkgs), len(mayImport))
	}
	for _, p := range pkgs {
		stage := strings.TrimPrefix(p.ImportPath, internal)
		for _, d := range p.Deps {
			for _, n := range never {
				if d == internal+n {
					t.Errorf("%s depends on %s (see `go list -deps %s`); a stage of the pipeline is reached through interfaces, it never depends on the core, the server assembly, the configuration or the command line", p.ImportPath, d, p.ImportPath)
				}
			}
		}
		if slices.Contains(p.Imports, internal+"config") {
			t.Errorf("%s imports %sconfig; only the server assembly reads the configuration", p.ImportPath, internal)
		}
		for _, imp := range p.Imports {
			other, ok := strings.CutPrefix(imp, internal)
			if _, isStage := mayImport[other]; !ok || !isStage || other == stage {
				continue
			}
			if !slices.Contains(mayImport[stage], other) {
				t.Errorf("%s imports the stage %s; stages talk through the core's interfaces (or list the import in TestPipelineStagesStandAlone with why)", p.ImportPath, imp)
			}
		}
	}
}
