package cli

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/tee"
	"github.com/confidential-mcp/cmcp/pkg/attestedlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// evidenceLog writes a short audit log whose genesis evidence comes from ev.
func evidenceLog(t *testing.T, ev func(statement digest.Digest, pub ed25519.PublicKey) (json.RawMessage, error), platform string) string {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	dir := filepath.Join(t.TempDir(), "log")
	w, err := auditlog.Open(dir, auditlog.Options{Key: key, CheckpointEvery: 10, Durability: record.DurabilityInterval,
		Gateway: record.GatewayInfo{Version: "test", Platform: platform}, Evidence: ev})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c := &record.Call{Session: "s1", Agent: "a", Tool: "fs__read", Upstream: "fs", EvidenceClass: evidence.ClassSpawnMeasured,
			Args: w.Commit([]byte{byte(i)}), Decision: record.DecisionAllow, PolicyMode: "enforcing",
			PolicyBundle: digest.Bytes([]byte("bundle")), Outcome: record.OutcomeForwarded}
		if _, err := w.Append(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func softwareEvidence(t *testing.T, mutate func(stmt *digest.Digest, pub *ed25519.PublicKey)) func(digest.Digest, ed25519.PublicKey) (json.RawMessage, error) {
	return func(stmt digest.Digest, pub ed25519.PublicKey) (json.RawMessage, error) {
		if mutate != nil {
			mutate(&stmt, &pub)
		}
		b, err := tee.NewSoftware(nil).Attest(context.Background(), pub, []byte("boot-nonce"), stmt)
		if err != nil {
			return nil, err
		}
		return b.Marshal()
	}
}

func TestVerifyChainSoftwareGenesisEvidence(t *testing.T) {
	dir := evidenceLog(t, softwareEvidence(t, nil), evidence.PlatformSoftware)
	code, out, errb := runCLI(t, "verify-chain", dir)
	if code != 0 || !strings.Contains(out, "epoch 1: key and genesis statement bound by software evidence: UNATTESTED, development only") {
		t.Fatalf("software genesis: %d\n%s\n%s", code, out, errb)
	}
	code, out, _ = runCLI(t, "-o", "json", "verify-chain", dir)
	var doc struct {
		Evidence []attestedlog.GenesisResult `json:"evidence"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 || len(doc.Evidence) != 1 ||
		doc.Evidence[0].Platform != "software" || doc.Evidence[0].Attested || doc.Evidence[0].Binding != evidence.BindingOurs {
		t.Fatalf("json: %v %s", err, out)
	}
	code, _, errb = runCLI(t, "verify-chain", dir, "--require-attested")
	if code != exitcode.ExitLogKey || !strings.Contains(errb, "software evidence") {
		t.Fatalf("--require-attested on software: %d %s", code, errb)
	}

	// A gateway that bound another statement or another key: exit 12.
	for name, mut := range map[string]func(*digest.Digest, *ed25519.PublicKey){
		"statement": func(s *digest.Digest, _ *ed25519.PublicKey) { *s = digest.Bytes([]byte("other")) },
		"key":       func(_ *digest.Digest, p *ed25519.PublicKey) { *p, _, _ = ed25519.GenerateKey(rand.Reader) },
	} {
		dir := evidenceLog(t, softwareEvidence(t, mut), evidence.PlatformSoftware)
		code, out, errb := runCLI(t, "verify-chain", dir)
		if code != exitcode.ExitLogKey || !strings.Contains(out+errb, "not the expected") {
			t.Errorf("other %s bound: %d\n%s\n%s", name, code, out, errb)
		}
	}
	// The genesis platform and the evidence disagree.
	dir = evidenceLog(t, softwareEvidence(t, nil), evidence.PlatformSEVSNP)
	if code, out, errb := runCLI(t, "verify-chain", dir); code != exitcode.ExitLogKey || !strings.Contains(out+errb, `genesis says platform "sev-snp" but its evidence is "software"`) {
		t.Errorf("platform mismatch: %d\n%s\n%s", code, out, errb)
	}
	// No evidence at all: a warning, a failure with --require-attested.
	dir = evidenceLog(t, nil, "")
	if code, out, _ := runCLI(t, "verify-chain", dir); code != 0 || !strings.Contains(out, "carries no attestation evidence") {
		t.Errorf("no evidence: %d %s", code, out)
	}
	if code, _, _ := runCLI(t, "verify-chain", dir, "--require-attested"); code != exitcode.ExitLogKey {
		t.Errorf("no evidence, --require-attested: %d", code)
	}
	// Reference values cannot be checked without hardware evidence: no
	// evidence, or software evidence, fails with --reference (both passed,
	// the auditor's values unapplied).
	ref := filepath.Join(t.TempDir(), "ref.json")
	os.WriteFile(ref, []byte(`{"sev-snp": {"measurements": ["`+strings.Repeat("77", 48)+`"]}}`), 0o644)
	if code, out, errb := runCLI(t, "verify-chain", dir, "--reference", ref); code != exitcode.ExitLogKey || !strings.Contains(errb, "reference values (--reference) cannot be checked") {
		t.Errorf("no evidence, --reference: %d\n%s\n%s", code, out, errb)
	}
	dir = evidenceLog(t, softwareEvidence(t, nil), evidence.PlatformSoftware)
	if code, out, errb := runCLI(t, "verify-chain", dir, "--reference", ref); code != exitcode.ExitLogKey || !strings.Contains(out+errb, `no "software" section`) {
		t.Errorf("software evidence, --reference: %d\n%s\n%s", code, out, errb)
	}
}

// snpGenesisLog writes an audit log whose genesis evidence comes from
// go-sev-guest's fake AMD secure processor, produced inside auditlog.Open for
// the real statement and key (launch measurement 77...77), and returns it
// with a file of the fake roots.
func snpGenesisLog(t *testing.T) (dir, roots string) {
	t.Helper()
	f := newSNPFake(t)
	return evidenceLog(t, f.ev, evidence.PlatformSEVSNP), f.roots
}

// SEV-SNP genesis evidence from go-sev-guest's fake AMD secure processor.
func TestVerifyChainSNPGenesisEvidence(t *testing.T) {
	dir, roots := snpGenesisLog(t)
	code, out, errb := runCLI(t, "verify-chain", dir, "--roots", roots, "--require-attested")
	if code != 0 || !strings.Contains(out, "epoch 1: key and genesis statement bound by verified sev-snp evidence") {
		t.Fatalf("SNP genesis: %d\n%s\n%s", code, out, errb)
	}
	// The fake chain does not reach the embedded AMD roots.
	code, out, errb = runCLI(t, "verify-chain", dir)
	if code != exitcode.ExitLogKey || !strings.Contains(out+errb, "ARK-Milan of the embedded roots") {
		t.Fatalf("SNP genesis, embedded roots: %d\n%s\n%s", code, out, errb)
	}
	// Reference values apply to the genesis evidence too.
	ref := filepath.Join(t.TempDir(), "ref.json")
	os.WriteFile(ref, []byte(`{"sev-snp": {"measurements": ["`+strings.Repeat("00", 48)+`"]}}`), 0o644)
	code, out, errb = runCLI(t, "verify-chain", dir, "--roots", roots, "--reference", ref)
	if code != exitcode.ExitLogKey || !strings.Contains(out+errb, "launch measurement 7777") {
		t.Fatalf("SNP genesis, other measurement: %d\n%s\n%s", code, out, errb)
	}
}

// TestRequireAttestedWithoutReferenceSaysMeasurementUnchecked: genuine
// hardware evidence whose launch measurement was not checked proves that the
// key lives in a genuine VM, not which code holds it. verify-chain now says
// so on the epoch's line and, with --require-attested, in one warning.
// Before, the line read "bound by verified sev-snp evidence, verdict warning
// (warnings: roots, measurement, ...)" and --require-attested passed silently.
func TestRequireAttestedWithoutReferenceSaysMeasurementUnchecked(t *testing.T) {
	dir, roots := snpGenesisLog(t)
	const line = "epoch 1: key and genesis statement bound by verified sev-snp evidence"
	const unchecked = "launch measurement NOT checked against reference values, so any code in a genuine sev-snp VM could hold this key: pass --reference with the expected values"
	const warning = "--require-attested: the key of epoch 1 is bound to genuine hardware evidence, but the launch measurement was NOT checked against reference values, so any code in a genuine VM could hold the key (pass --reference with the expected measurements)"
	code, out, errb := runCLI(t, "verify-chain", dir, "--roots", roots, "--require-attested")
	if code != 0 || !strings.Contains(out, line) || !strings.Contains(out, unchecked) || strings.Count(out+errb, warning) != 1 {
		t.Fatalf("--require-attested without --reference: %d\n%s\n%s", code, out, errb)
	}
	// Without --require-attested the epoch's line says it; no extra warning.
	code, out, errb = runCLI(t, "verify-chain", dir, "--roots", roots)
	if code != 0 || !strings.Contains(out, unchecked) || strings.Contains(out+errb, "--require-attested:") {
		t.Fatalf("without --require-attested: %d\n%s\n%s", code, out, errb)
	}
	// JSON: in the warnings and in the epoch's note.
	code, out, _ = runCLI(t, "-o", "json", "verify-chain", dir, "--roots", roots, "--require-attested")
	var doc struct {
		Warnings []string                    `json:"warnings"`
		Evidence []attestedlog.GenesisResult `json:"evidence"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 || !slices.Contains(doc.Warnings, warning) ||
		len(doc.Evidence) != 1 || doc.Evidence[0].Note != unchecked {
		t.Fatalf("json: %d %v %s", code, err, out)
	}
	// Reference values that pin no measurement do not check it either.
	tcbOnly := filepath.Join(t.TempDir(), "tcb-only.json")
	os.WriteFile(tcbOnly, []byte(`{"sev-snp": {"minimum_tcb": {"bootloader": 0, "tee": 0, "snp": 0, "microcode": 0}}}`), 0o644)
	code, out, errb = runCLI(t, "verify-chain", dir, "--roots", roots, "--require-attested", "--reference", tcbOnly)
	if code != 0 || !strings.Contains(out, "could hold this key: the --reference values pin none") || !strings.Contains(out+errb, "(the --reference values pin no launch measurement)") {
		t.Fatalf("--reference without measurements: %d\n%s\n%s", code, out, errb)
	}
	// With the measurement pinned, neither is said.
	ref := filepath.Join(t.TempDir(), "ref.json")
	os.WriteFile(ref, []byte(`{"sev-snp": {"measurements": ["`+strings.Repeat("77", 48)+`"]}}`), 0o644)
	code, out, errb = runCLI(t, "verify-chain", dir, "--roots", roots, "--require-attested", "--reference", ref)
	if code != 0 || !strings.Contains(out, line) || strings.Contains(out+errb, "NOT checked") {
		t.Fatalf("measurement pinned: %d\n%s\n%s", code, out, errb)
	}
}
