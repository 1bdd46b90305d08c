//go:build peers

package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/witness/litewitness"
)

// auditorDoc is the auditor's guide whose example outputs this test makes.
const auditorDoc = "../../docs/auditor.md"

var (
	docTime = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	docB64  = regexp.MustCompile(`[A-Za-z0-9+/]{43}=`)
	docKey  = regexp.MustCompile(`\+[0-9a-f]{8}\b`)
	docRand = regexp.MustCompile(`(epoch-\d{6}-)[0-9a-f]{8}`)
)

// normalize makes an output stable: times, hashes and key hashes vary.
func normalize(s string) string {
	s = docTime.ReplaceAllString(s, "2026-12-05T05:00:00Z")
	s = docB64.ReplaceAllString(s, "<root>")
	s = docRand.ReplaceAllString(s, "${1}rrrrrrrr")
	return docKey.ReplaceAllString(s, "+hhhhhhhh") // same widths: tables stay aligned
}

// TestAuditorDoc: the outputs in docs/auditor.md are what verify-chain
// prints for a witnessed log verified with no saved checkpoint, a receipt
// verified alone and a fleet verified at once, against a real witness
// (times, hashes and key hashes normalized). CMCP_UPDATE_DOCS=1 rewrites
// them.
func TestAuditorDoc(t *testing.T) {
	docPath, err := filepath.Abs(auditorDoc)
	if err != nil {
		t.Fatal(err)
	}
	lw := litewitness.Start(t, "witness.example/w1")
	work := t.TempDir()
	t.Chdir(work)
	for _, name := range []string{"gw1", "gw2", "gw3"} {
		d := witnessedLogAt(t, lw, "example.com/"+name)
		if err := os.Rename(d, filepath.Join(work, name)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile("witness.vkey", []byte(lw.Vkey+"\n"), 0o600)
	outputs := map[string]string{}
	run := func(name string, args ...string) string {
		code, out, errOut := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", name, code, out, errOut)
		}
		outputs[name] = "$ cmcp " + strings.Join(args, " ") + "\n" + normalize(out)
		return out
	}
	run("witnessed", "verify-chain", "gw1", "--witness", "witness.vkey")
	receipt := run("make-receipt", "verify-chain", "gw1", "--make-receipt", "3")
	os.WriteFile("s3.receipt", []byte(receipt), 0o600)
	outputs["make-receipt"] = "$ cmcp verify-chain gw1 --make-receipt 3 > s3.receipt\n"
	run("receipt", "verify-chain", "--receipt", "s3.receipt", "--witness", "witness.vkey")
	run("fleet", "verify-chain", "gw1", "gw2", "gw3", "--witness", "witness.vkey")

	b, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	re := regexp.MustCompile("(?s)<!-- output: ([a-z-]+) -->\n```text\n(.*?)```")
	found := map[string]bool{}
	updated := re.ReplaceAllStringFunc(doc, func(m string) string {
		sub := re.FindStringSubmatch(m)
		name, have := sub[1], sub[2]
		found[name] = true
		want, ok := outputs[name]
		if !ok {
			t.Errorf("docs/auditor.md has an output block %q this test does not make", name)
			return m
		}
		if have != want && os.Getenv("CMCP_UPDATE_DOCS") == "" {
			t.Errorf("docs/auditor.md output %q differs from what verify-chain prints (CMCP_UPDATE_DOCS=1 rewrites it):\n--- doc\n%s--- now\n%s", name, have, want)
		}
		return "<!-- output: " + name + " -->\n```text\n" + want + "```"
	})
	for name := range outputs {
		if !found[name] {
			t.Errorf("docs/auditor.md lacks the output block %q", name)
		}
	}
	if os.Getenv("CMCP_UPDATE_DOCS") != "" && updated != doc {
		if err := os.WriteFile(docPath, []byte(updated), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
