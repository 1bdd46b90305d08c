package cmcp_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestClaimsNameRealTests: docs/CLAIMS.md, the table of every security
// property cmcp claims, names each claim by a stable id and each row names
// tests or scripts that exist, so a renamed or deleted test cannot leave a
// claim unproven and a claim cannot be renumbered into another.
func TestClaimsNameRealTests(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("docs", "CLAIMS.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Claims\n")
	if start < 0 {
		t.Fatal(`docs/CLAIMS.md has no "## Claims" section`)
	}
	section := doc[start:]

	var sources strings.Builder
	err = filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && p != "." {
			return filepath.SkipDir
		}
		if strings.HasSuffix(p, "_test.go") {
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sources.Write(src)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every function declared at the start of a line in a test file, found
	// in one pass over the sources (a regexp per name took minutes under
	// -race).
	declared := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^func ([A-Za-z0-9_]+)\(`).FindAllStringSubmatch(sources.String(), -1) {
		declared[m[1]] = true
	}

	row := regexp.MustCompile("^\\| `([^`]*)` \\| (.*) \\| (.*) \\|$")
	id := regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
	testName := regexp.MustCompile("`((?:Test|Fuzz|Example)[A-Za-z0-9_]+)`")
	script := regexp.MustCompile("`([a-z0-9_]+\\.txtar)`")
	seen := map[string]bool{}
	rows, names := 0, 0
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| id |") {
			continue
		}
		m := row.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("docs/CLAIMS.md: a row that is not | `id` | property | tests |: %.120s", line)
			continue
		}
		rows++
		if !id.MatchString(m[1]) {
			t.Errorf("claim id %q: want lower-case words joined by '-'", m[1])
		}
		if seen[m[1]] {
			t.Errorf("claim id %q is used twice; ids are never reused", m[1])
		}
		seen[m[1]] = true
		tests, scripts := testName.FindAllStringSubmatch(m[3], -1), script.FindAllStringSubmatch(m[3], -1)
		if len(tests)+len(scripts) == 0 {
			t.Errorf("claim %s names no test or script", m[1])
		}
		for _, tm := range tests {
			names++
			if !declared[tm[1]] {
				t.Errorf("claim %s names %s, which is not a test in this module", m[1], tm[1])
			}
		}
		for _, sm := range scripts {
			if _, err := os.Stat(filepath.Join("testdata", "script", sm[1])); err != nil {
				t.Errorf("claim %s names the script %s: %v", m[1], sm[1], err)
			}
		}
	}
	if rows == 0 {
		t.Fatal("the claims table has no rows")
	}
	t.Logf("%d claims, %d test names", rows, names)
}
