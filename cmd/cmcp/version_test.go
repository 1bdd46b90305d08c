package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestVersionStampedByLdflags builds cmcp the way the release does (the
// -ldflags -X of goreleaser.yaml, -trimpath) and checks that `cmcp version`
// prints the stamped version, commit and date, in text and in JSON.
func TestVersionStampedByLdflags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cmcp")
	const pkg = "github.com/confidential-mcp/cmcp/internal/buildinfo"
	ldflags := "-X " + pkg + ".Version=v9.8.7 -X " + pkg + ".Commit=0123abcd -X " + pkg + ".Date=2026-01-02T03:04:05Z"
	if out, err := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("cmcp version: %v\n%s", err, out)
	}
	for _, want := range []string{"cmcp v9.8.7\n", "commit:   0123abcd\n", "built:    2026-01-02T03:04:05Z\n", "go:       " + runtime.Version() + "\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cmcp version: no %q in\n%s", want, out)
		}
	}
	out, err = exec.Command(bin, "version", "--output", "json").Output()
	if err != nil {
		t.Fatalf("cmcp version --output json: %v", err)
	}
	var doc struct {
		SchemaVersion int    `json:"schema_version"`
		Version       string `json:"version"`
		Commit        string `json:"commit"`
		Date          string `json:"date"`
		GoVersion     string `json:"go_version"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("version JSON: %v\n%s", err, out)
	}
	if doc.SchemaVersion != 2 || doc.Version != "v9.8.7" || doc.Commit != "0123abcd" || doc.Date != "2026-01-02T03:04:05Z" || doc.GoVersion != runtime.Version() {
		t.Fatalf("version JSON: %+v", doc)
	}
}
