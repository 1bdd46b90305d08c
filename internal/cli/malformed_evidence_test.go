package cli

import (
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/confidential-mcp/cmcp/internal/ui"
	"github.com/confidential-mcp/cmcp/pkg/attestedlog"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// malformedTDXQuote is the genuine SPR E4 quote with one field changed: the
// QE authentication data length (u16 at offset 1218) set to 0xffff, past the
// end of the quote.
func malformedTDXQuote(t *testing.T) []byte {
	t.Helper()
	q, err := os.ReadFile("../../testdata/evidence/tdx-spr-e4-quote.dat")
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(q[1218:], 0xffff)
	return q
}

// runCLINoPanic is runCLI failing the test if cli.Main panics.
func runCLINoPanic(t *testing.T, args ...string) (code int, out, errb string) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("cmcp %s panicked: %v", strings.Join(args, " "), p)
		}
	}()
	return runCLI(t, args...)
}

func tdxBundleJSON(t *testing.T, quote []byte, pub ed25519.PublicKey, stmt digest.Digest) json.RawMessage {
	t.Helper()
	bd, err := evidence.NewBinding(pub, []byte("boot-nonce"), stmt)
	if err != nil {
		t.Fatal(err)
	}
	b := &evidence.Bundle{Format: evidence.Format, Platform: evidence.PlatformTDX, Attested: true, Binding: bd,
		Evidence: &evidence.Raw{Type: evidence.TypeTDXQuote, Data: quote}, Collector: "test", CollectedAt: time.Unix(0, 0).UTC()}
	j, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// TestMalformedTDXQuoteIsRejectedNotACrash: one changed byte in a TDX quote
// (its QE authentication data length) made go-tdx-guest's parser panic, and
// with it `cmcp attest verify` and `cmcp verify-chain` (exit 2, as for a
// usage error). It is contraindicated evidence: exit 20 for attest verify,
// exit 12 (rejected genesis evidence) for verify-chain.
func TestMalformedTDXQuoteIsRejectedNotACrash(t *testing.T) {
	quote := malformedTDXQuote(t)
	t.Run("attest verify --raw-report", func(t *testing.T) {
		f := t.TempDir() + "/q.dat"
		if err := os.WriteFile(f, quote, 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errb := runCLINoPanic(t, "attest", "verify", "--raw-report", f, "--at", "2025-06-01T00:00:00Z")
		if code != 20 || !strings.Contains(out, "✗ evidence") || !strings.Contains(errb, "the TDX quote is malformed: QE authentication data length 65535") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errb)
		}
	})
	t.Run("attest verify bundle", func(t *testing.T) {
		pub, _, _ := ed25519.GenerateKey(nil)
		f := t.TempDir() + "/ev.json"
		if err := os.WriteFile(f, tdxBundleJSON(t, quote, pub, digest.Digest{}), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errb := runCLINoPanic(t, "attest", "verify", f, "--at", "2025-06-01T00:00:00Z")
		if code != 20 || !strings.Contains(errb, "the TDX quote is malformed") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errb)
		}
	})
	t.Run("verify-chain", func(t *testing.T) {
		dir := evidenceLog(t, func(stmt digest.Digest, pub ed25519.PublicKey) (json.RawMessage, error) {
			return tdxBundleJSON(t, quote, pub, stmt), nil
		}, evidence.PlatformTDX)
		code, out, errb := runCLINoPanic(t, "verify-chain", dir)
		if code != 12 || !strings.Contains(errb, "the TDX quote is malformed") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errb)
		}
	})
	// The genuine two-epoch fixture verified with its trusted keys, the
	// genesis of epoch 1 rewritten to carry the malformed quote (statement
	// recomputed): the evidence is parsed when the genesis is read, before
	// the next record's hash link or any signature exposes the rewrite.
	t.Run("verify-chain --key, tampered genesis", func(t *testing.T) {
		dir := t.TempDir() + "/log"
		if err := os.CopyFS(dir, os.DirFS("../../testdata/auditlog/log")); err != nil {
			t.Fatal(err)
		}
		seg := dir + "/epoch-000001/seg-000001.jsonl"
		data, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		nl := strings.IndexByte(string(data), '\n')
		var line map[string]any
		if err := json.Unmarshal(data[:nl], &line); err != nil {
			t.Fatal(err)
		}
		body := line["body"].(map[string]any)
		body["gateway"].(map[string]any)["platform"] = "tdx"
		delete(body, "evidence")
		delete(body, "statement")
		raw, _ := json.Marshal(body)
		canon, err := digest.Canonicalize(raw)
		if err != nil {
			t.Fatal(err)
		}
		st, err := digest.JSON(canon)
		if err != nil {
			t.Fatal(err)
		}
		body["statement"] = st.String()
		var bm any
		if err := json.Unmarshal(tdxBundleJSON(t, quote, make([]byte, 32), st), &bm); err != nil {
			t.Fatal(err)
		}
		body["evidence"] = bm
		lineRaw, _ := json.Marshal(line)
		canon, err = digest.Canonicalize(lineRaw)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(seg, append(canon, data[nl:]...), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errb := runCLINoPanic(t, "verify-chain", "--key", "../../testdata/auditlog/keys", dir)
		if code != 12 || !strings.Contains(errb, "genesis evidence: epoch 1: evidence rejected: evidence: the TDX quote is malformed") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errb)
		}
	})
}

// TestAttestedIsFalseForEvidenceThatDidNotVerify: "attested" in the JSON of
// attest verify and of verify-chain's evidence[] is true only for hardware
// evidence that verified. Before, it was true for any bundle naming sev-snp
// or tdx: a 3-byte "quote", a genuine quote bound to another key.
func TestAttestedIsFalseForEvidenceThatDidNotVerify(t *testing.T) {
	genuine, err := os.ReadFile("../../testdata/evidence/tdx-spr-e4-quote.dat")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("attest verify", func(t *testing.T) {
		pub, _, _ := ed25519.GenerateKey(nil)
		f := t.TempDir() + "/ev.json"
		if err := os.WriteFile(f, tdxBundleJSON(t, []byte{4, 0, 2}, pub, digest.Digest{}), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errb := runCLINoPanic(t, "-o", "json", "attest", "verify", f)
		var doc struct {
			SchemaVersion int             `json:"schema_version"`
			Attested      *bool           `json:"attested"`
			Verdict       evidence.Status `json:"verdict"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 20 || doc.Attested == nil || *doc.Attested || doc.Verdict != evidence.StatusContraindicated || doc.SchemaVersion != ui.SchemaVersion {
			t.Fatalf("exit %d, %v\nstdout:\n%s\nstderr:\n%s", code, err, out, errb)
		}
	})
	t.Run("verify-chain", func(t *testing.T) {
		dir := evidenceLog(t, func(stmt digest.Digest, pub ed25519.PublicKey) (json.RawMessage, error) {
			return tdxBundleJSON(t, genuine, pub, stmt), nil
		}, evidence.PlatformTDX)
		code, out, errb := runCLINoPanic(t, "-o", "json", "verify-chain", dir)
		var doc struct {
			Evidence []attestedlog.GenesisResult `json:"evidence"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 12 || len(doc.Evidence) != 1 ||
			doc.Evidence[0].Attested || doc.Evidence[0].Platform != evidence.PlatformTDX || doc.Evidence[0].Binding != evidence.BindingMismatch {
			t.Fatalf("exit %d, %v\nstdout:\n%s\nstderr:\n%s", code, err, out, errb)
		}
		// The text names the platform and the verdict, never "software".
		code, out, errb = runCLINoPanic(t, "verify-chain", dir)
		if code != 12 || strings.Contains(out, "software") || strings.Contains(out, "bound by verified") {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errb)
		}
	})
}
