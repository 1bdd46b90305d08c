package cmcp_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/config"
	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/gateway"
	"github.com/confidential-mcp/cmcp/internal/upstream"
)

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tableRows returns the cells of the rows of the first Markdown table after
// the heading in doc (header and separator rows left out).
func tableRows(t *testing.T, doc, heading string) [][]string {
	t.Helper()
	doc = "\n" + doc
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("no %q section", heading)
	}
	var rows [][]string
	started := false
	for _, line := range strings.Split(doc[i+len(heading)+2:], "\n") {
		if !strings.HasPrefix(line, "|") {
			if started {
				break
			}
			continue
		}
		if !started {
			started = true // the header
			continue
		}
		if strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		rows = append(rows, cells)
	}
	return rows
}

// TestReadmeIsShort: README.md is the front door (what cmcp is, the two
// commands, a tour, status, links); references belong under docs/.
func TestReadmeIsShort(t *testing.T) {
	if n := len(readDoc(t, "README.md")); n > 15*1024 {
		t.Errorf("README.md is %d bytes, more than 15 KiB: move reference material to docs/<topic>.md and link it", n)
	}
}

// TestReadmeListsEveryPackage: the development section of README.md draws
// the house as a list of packages, one line each; a new package is added
// there, a removed one taken out.
func TestReadmeListsEveryPackage(t *testing.T) {
	readme := readDoc(t, "README.md")
	i := strings.Index(readme, "\n## Development\n")
	if i < 0 {
		t.Fatal("README.md has no Development section")
	}
	dev := readme[i:]
	if j := strings.Index(dev[1:], "\n## "); j >= 0 {
		dev = dev[:j+1]
	}
	const module = "github.com/confidential-mcp/cmcp"
	var listed []string
	for _, p := range goList(t, "./...") {
		if p.ImportPath == module {
			continue
		}
		rel := strings.TrimPrefix(p.ImportPath, module+"/")
		name := rel
		if strings.HasPrefix(rel, "internal/bench/") {
			name = strings.TrimPrefix(rel, "internal/bench/") // listed with the benchmark
		}
		if !strings.Contains(dev, "`"+name+"`") {
			t.Errorf("README.md's Development section does not list %s: add a line saying what it is", rel)
		}
		listed = append(listed, rel)
	}
	for _, m := range regexp.MustCompile("`((?:internal|pkg|cmd)/[a-z0-9/]+)`").FindAllStringSubmatch(dev, -1) {
		if !slices.Contains(listed, m[1]) {
			t.Errorf("README.md's Development section lists %s, which is not a package", m[1])
		}
	}
}

// TestErrorCodeTablesMatchTheCode: docs/errors.md lists every JSON-RPC code
// the gateway answers with and every exit code, with the numbers the code
// uses.
func TestErrorCodeTablesMatchTheCode(t *testing.T) {
	doc := readDoc(t, filepath.Join("docs", "errors.md"))

	exits := tableRows(t, doc, "## Exit codes")
	if len(exits) != len(exitcode.ExitCodes) {
		t.Errorf("docs/errors.md lists %d exit codes, internal/exitcode %d", len(exits), len(exitcode.ExitCodes))
	}
	for i, c := range exitcode.ExitCodes {
		if i >= len(exits) {
			break
		}
		if want := []string{strconv.Itoa(c.Code), c.Meaning}; !slices.Equal(exits[i], want) {
			t.Errorf("docs/errors.md exit code row %d = %q, want %q (internal/exitcode.ExitCodes)", i+1, exits[i], want)
		}
	}

	codes := map[int]bool{}
	for _, r := range tableRows(t, doc, "## JSON-RPC error codes of the gateway") {
		n, err := strconv.Atoi(r[0])
		if err != nil {
			t.Errorf("docs/errors.md: JSON-RPC code %q is not a number", r[0])
		}
		codes[n] = true
	}
	for _, c := range []int{
		gateway.CodeUnknownTool, gateway.CodeDenied, gateway.CodeUpstreamUnavailable,
		gateway.CodeAuditUnavailable, gateway.CodeKillSwitch, gateway.CodeToolDrifted,
		gateway.CodeUpstreamTimeout, gateway.CodeUpstreamFailed, gateway.CodeShuttingDown,
		gateway.CodeTooManySessions, gateway.CodeResourceNotFound, gateway.CodeNotRoutable,
		gateway.CodeSessionEnded, upstream.CodeTooManyServerRequests,
	} {
		if !codes[c] {
			t.Errorf("docs/errors.md does not list the gateway's JSON-RPC code %d", c)
		}
	}
}

// TestConfigurationReferenceListsEveryKey: docs/configuration.md has a row
// for every key cmcp.yaml may hold (read from internal/config's types), and
// no row for a key that does not exist.
func TestConfigurationReferenceListsEveryKey(t *testing.T) {
	var keys []string
	var walk func(reflect.Type, string)
	walk = func(ty reflect.Type, prefix string) {
		for ty.Kind() == reflect.Pointer || ty.Kind() == reflect.Slice {
			ty = ty.Elem()
		}
		if ty.Kind() == reflect.Map {
			walk(ty.Elem(), prefix+"<name>.")
			return
		}
		if ty.Kind() != reflect.Struct {
			return
		}
		for f := range ty.Fields() {
			tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if tag == "-" || tag == "" || !f.IsExported() {
				continue
			}
			keys = append(keys, prefix+tag)
			walk(f.Type, prefix+tag+".")
		}
	}
	walk(reflect.TypeFor[config.Config](), "")
	var documented []string
	for _, r := range tableRows(t, readDoc(t, filepath.Join("docs", "configuration.md")), "# Configuration reference: `cmcp.yaml`") {
		documented = append(documented, strings.Trim(r[0], "`"))
	}
	for _, k := range keys {
		if !slices.Contains(documented, k) {
			t.Errorf("docs/configuration.md has no row for %s", k)
		}
	}
	for _, k := range documented {
		if !slices.Contains(keys, k) {
			t.Errorf("docs/configuration.md documents %s, which internal/config does not read", k)
		}
	}
}
