package cmcp_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeClaimsNameRealTests: every test, fuzz test and script named in
// README.md's "Security properties and the tests that prove them" table
// exists, so a renamed or deleted test cannot leave a claim unproven.
func TestReadmeClaimsNameRealTests(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start := strings.Index(readme, "## Security properties and the tests that prove them")
	if start < 0 {
		t.Fatal(`README.md has no "Security properties and the tests that prove them" section`)
	}
	section := readme[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| #") {
			rows++
		}
	}
	if rows == 0 {
		t.Fatal("the security properties table has no rows")
	}

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
	all := sources.String()
	names := regexp.MustCompile("`((?:Test|Fuzz)[A-Za-z0-9_]+)`").FindAllStringSubmatch(section, -1)
	if len(names) < rows {
		t.Fatalf("%d tests named for %d properties", len(names), rows)
	}
	for _, m := range names {
		if !regexp.MustCompile(`(?m)^func ` + m[1] + `\(`).MatchString(all) {
			t.Errorf("README.md names %s, which is not a test in this module", m[1])
		}
	}
	for _, m := range regexp.MustCompile("`([a-z0-9_]+\\.txtar)`").FindAllStringSubmatch(section, -1) {
		if _, err := os.Stat(filepath.Join("testdata", "script", m[1])); err != nil {
			t.Errorf("README.md names the script %s: %v", m[1], err)
		}
	}
	t.Logf("%d properties, %d test names", rows, len(names))
}
