package cli

// Attacks on an attested log by an operator who controls the disk but not
// the TEE key (found in review): each once verified with every option an
// auditor has.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	labi "github.com/google/go-sev-guest/client/linuxabi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	stest "github.com/google/go-sev-guest/testing"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/tee"
	"github.com/confidential-mcp/cmcp/pkg/auditlog"
	"github.com/confidential-mcp/cmcp/pkg/auditlog/record"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// snpFake is one fake AMD chip (one cert chain) that attests every epoch.
type snpFake struct {
	signer *stest.AmdSigner
	roots  string
}

const attackFMS = 0x00a00f10

func newSNPFake(t *testing.T) *snpFake {
	t.Helper()
	s, err := stest.DefaultTestOnlyCertChain(kds.ProductName(abi.SevProductFromCpuid1Eax(attackFMS)), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, c := range [][]byte{s.Ark.Raw, s.Ask.Raw} {
		pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c})
	}
	roots := filepath.Join(t.TempDir(), "roots.pem")
	os.WriteFile(roots, buf.Bytes(), 0o644)
	return &snpFake{signer: s, roots: roots}
}

func (f *snpFake) ev(stmt digest.Digest, pub ed25519.PublicKey) (json.RawMessage, error) {
	nonce := []byte("boot-nonce")
	rd, err := evidence.ReportData(pub, nonce, stmt)
	if err != nil {
		return nil, err
	}
	rep := &spb.Report{
		Version: 3, Policy: abi.SnpPolicyToBytes(abi.SnpPolicy{SMT: true}), SignatureAlgo: abi.SignEcdsaP384Sha384,
		ReportData: rd[:], Measurement: bytes.Repeat([]byte{0x77}, 48), HostData: make([]byte, 32), FamilyId: make([]byte, 16),
		ImageId: make([]byte, 16), IdKeyDigest: make([]byte, 48), AuthorKeyDigest: make([]byte, 48), ReportId: make([]byte, 32),
		ReportIdMa: make([]byte, 32), ChipId: make([]byte, 64), Signature: make([]byte, 512), Cpuid1EaxFms: attackFMS,
	}
	raw, err := abi.ReportToAbiBytes(rep)
	if err != nil {
		return nil, err
	}
	var out [labi.SnpReportRespReportSize]byte
	copy(out[:], raw)
	qp, err := stest.TcQuoteProvider([]stest.TestCase{{Name: "genesis", Input: rd, Output: out}},
		&stest.DeviceOptions{Now: time.Now(), Signer: f.signer, Product: abi.SevProductFromCpuid1Eax(attackFMS)})
	if err != nil {
		return nil, err
	}
	b, err := tee.NewSNP(qp, "test-device", nil).Attest(context.Background(), pub, nonce, stmt)
	if err != nil {
		return nil, err
	}
	return b.Marshal()
}

// openAttested starts the genuine writer on dir with a fresh key and SNP evidence:
// what the operator gets by (re)starting the real gateway in the real TEE.
func openAttested(t *testing.T, dir string, f *snpFake, opts auditlog.Options) *auditlog.Writer {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	opts.Key = key
	opts.Evidence = f.ev
	opts.Gateway = record.GatewayInfo{Version: "test", Platform: evidence.PlatformSEVSNP}
	if opts.Durability == "" {
		opts.Durability = record.DurabilityGroup
	}
	w, err := auditlog.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func appendCalls(t *testing.T, w *auditlog.Writer, n int, tool string) {
	t.Helper()
	for i := range n {
		c := &record.Call{Session: "s1", Agent: "agent-a", Tool: tool, Upstream: "fs", EvidenceClass: evidence.ClassSpawnMeasured,
			Args: w.Commit([]byte(fmt.Sprintf(`{"i":%d}`, i))), Decision: record.DecisionAllow, PolicyMode: "enforcing",
			PolicyBundle: digest.Bytes([]byte("bundle")), Outcome: record.OutcomeForwarded}
		if _, err := w.Append(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
}

func lastIndexOfKind(lines [][]byte, kind string) int {
	for i := len(lines) - 1; i >= 0; i-- {
		if kindOf(lines[i]) == kind {
			return i
		}
	}
	return -1
}

// setSeq rewrites the seq member of a line (prev is fixed by rechain).
func setSeq(t *testing.T, line []byte, seq int) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatal(err)
	}
	m["seq"], _ = json.Marshal(strconv.Itoa(seq))
	raw, _ := json.Marshal(m)
	out, err := digest.Canonicalize(raw)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Finding 1: an operator kills the attested gateway, rewrites / appends
// records after the last checkpoint of the crashed epoch (no key needed),
// and restarts the genuine gateway in the TEE. The new attested genesis
// "covers" the forged records and verify-chain, with every option an
// auditor has (--key for every epoch, --require-attested, --checkpoint),
// reports VERIFIED, exit 0, and tells the auditor the forged records are
// "covered by epoch 2's signed genesis".
func TestForgedCrashedTailIsUnsigned(t *testing.T) {
	f := newSNPFake(t)
	live := filepath.Join(t.TempDir(), "log")
	w1 := openAttested(t, live, f, auditlog.Options{CheckpointEvery: 1000, CheckpointInterval: time.Hour})
	appendCalls(t, w1, 5, "fs__read")
	if err := w1.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// Three calls the gateway really forwarded: durable (group) before forwarding.
	appendCalls(t, w1, 3, "fs__delete_everything")
	k1 := w1.VerifierKey()

	// The operator SIGKILLs the gateway: the directory as it is now.
	dir := filepath.Join(t.TempDir(), "log")
	if err := os.CopyFS(dir, os.DirFS(live)); err != nil {
		t.Fatal(err)
	}
	w1.Close() // (the live copy is discarded)

	// The auditor saved a checkpoint while epoch 1 was running.
	saved := filepath.Join(t.TempDir(), "auditor.cp")
	if code, out, errOut := runCLI(t, "verify-chain", dir, "--key", k1, "--roots", f.roots, "--require-attested", "--save-checkpoint", saved); code != 0 {
		t.Fatalf("auditor's first run: %d\n%s%s", code, out, errOut)
	}

	// The operator rewrites the three real call records (the tool that was
	// really called disappears) and appends two forged ones.
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	ls := readLines(t, seg)
	cp := lastIndexOfKind(ls, "checkpoint")
	if cp != len(ls)-4 {
		t.Fatalf("expected 3 records after the last checkpoint, got %d", len(ls)-1-cp)
	}
	for i := cp + 1; i < len(ls); i++ {
		ls[i] = bytes.ReplaceAll(ls[i], []byte("fs__delete_everything"), []byte("fs__read"))
	}
	for range 2 {
		forged := bytes.Replace(ls[cp+1], []byte(`"agent":"agent-a"`), []byte(`"agent":"agent-b"`), 1)
		ls = append(ls, setSeq(t, forged, len(ls)))
	}
	_, anyKey, _ := ed25519.GenerateKey(rand.Reader) // signs nothing: there is no checkpoint after cp
	rechain(t, ls, cp+1, anyKey)
	writeLines(t, seg, ls)

	// The operator restarts the genuine gateway in the TEE.
	w2 := openAttested(t, dir, f, auditlog.Options{CheckpointEvery: 1000})
	appendCalls(t, w2, 2, "fs__read")
	k2 := w2.VerifierKey()
	w2.Close()

	// --require-attested (which implies --require-signed) refuses the log:
	// records 9-13 of epoch 1 were never signed by its key.
	code, out, errOut := runCLI(t, "verify-chain", dir, "--key", k1, "--key", k2, "--roots", f.roots, "--require-attested", "--checkpoint", saved)
	if code != exitcode.ExitLogSig || !strings.Contains(errOut, fmt.Sprintf("records %d-%d of epoch 1 are not signed by the epoch's key", cp+1, len(ls)-1)) {
		t.Fatalf("--require-attested on a log with a forged unsigned tail: exit %d\n%s%s", code, out, errOut)
	}
	// Without it the log verifies, and says plainly that those records are
	// unsigned (not "covered by epoch 2's signed genesis").
	code, out, errOut = runCLI(t, "verify-chain", dir, "--key", k1, "--key", k2, "--roots", f.roots, "--checkpoint", saved)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("UNSIGNED: records %d-%d of epoch 1", cp+1, len(ls)-1)) || strings.Contains(out, "covered by epoch") {
		t.Fatalf("verify-chain: exit %d\n%s%s", code, out, errOut)
	}
}

// Finding 2: records appended after a sealed epoch's final checkpoint, then
// the genuine gateway restarted: exit 0, VERIFIED. The verifier knows the
// writer never writes them (FORMAT.md: "they were appended by someone else")
// yet the log passes, with contradictory warnings ("was not sealed (the
// writer stopped without closing it)" and "was sealed, yet ...").
func TestRecordsAfterSealAreRefused(t *testing.T) {
	f := newSNPFake(t)
	dir := filepath.Join(t.TempDir(), "log")
	w1 := openAttested(t, dir, f, auditlog.Options{CheckpointEvery: 1000})
	appendCalls(t, w1, 4, "fs__read")
	k1 := w1.VerifierKey()
	w1.Close()
	saved := filepath.Join(t.TempDir(), "auditor.cp")
	if code, out, errOut := runCLI(t, "verify-chain", dir, "--key", k1, "--roots", f.roots, "--require-attested", "--save-checkpoint", saved); code != 0 {
		t.Fatalf("%d %s%s", code, out, errOut)
	}
	seg := filepath.Join(dir, "epoch-000001", "seg-000001.jsonl")
	ls := readLines(t, seg)
	n := len(ls)
	for i := range 3 {
		forged := bytes.Replace(ls[2], []byte(`"agent":"agent-a"`), []byte(`"agent":"mallory"`), 1)
		ls = append(ls, setSeq(t, forged, n+i))
	}
	_, anyKey, _ := ed25519.GenerateKey(rand.Reader)
	rechain(t, ls, n, anyKey)
	writeLines(t, seg, ls)

	w2 := openAttested(t, dir, f, auditlog.Options{CheckpointEvery: 1000})
	k2 := w2.VerifierKey()
	w2.Close()
	// The restart cut them (kept aside, in its recovery record): epoch 1 is
	// what the writer sealed, and the log verifies strictly.
	code, out, errOut := runCLI(t, "verify-chain", dir, "--key", k1, "--key", k2, "--roots", f.roots, "--require-attested", "--checkpoint", saved)
	if code != 0 || !strings.Contains(out, "bytes of an incomplete or damaged tail were cut") || strings.Contains(out, "mallory") {
		t.Fatalf("verify-chain: exit %d\n%s%s", code, out, errOut)
	}
	if got := readLines(t, seg); len(got) != n {
		t.Fatalf("epoch 1 has %d lines after the restart, want the %d the writer wrote", len(got), n)
	}
	// Before a restart, verify-chain refuses them.
	ls = append(readLines(t, seg), ls[n:]...)
	writeLines(t, seg, ls)
	if code, out, errOut := runCLI(t, "verify-chain", filepath.Dir(filepath.Dir(seg)), "--key", k1, "--key", k2, "--roots", f.roots); code != exitcode.ExitLogInteg || !strings.Contains(errOut, "after the epoch's seal") {
		t.Fatalf("records after a seal: exit %d\n%s%s", code, out, errOut)
	}
}

// Finding 3: with --key, an epoch that borrows a trusted key from another
// epoch (same origin, same key string) and has no checkpoint at all is
// reported as "signed by a trusted key", though nothing in it is signed.
// The genuine writer, restarted, chains onto it. The saved checkpoint of
// epoch 1 is then matched against the borrowed epoch 2 (same origin).
func TestEpochBorrowingAnOriginIsRefused(t *testing.T) {
	f := newSNPFake(t)
	dir := filepath.Join(t.TempDir(), "log")
	w1 := openAttested(t, dir, f, auditlog.Options{CheckpointEvery: 1000})
	appendCalls(t, w1, 4, "fs__read")
	k1, o1 := w1.VerifierKey(), w1.Origin()
	w1.Close()
	saved := filepath.Join(t.TempDir(), "auditor.cp")
	if code, out, errOut := runCLI(t, "verify-chain", dir, "--key", k1, "--roots", f.roots, "--save-checkpoint", saved); code != 0 {
		t.Fatalf("%d %s%s", code, out, errOut)
	}
	e1 := readLines(t, filepath.Join(dir, "epoch-000001", "seg-000001.jsonl"))

	// Root of epoch 1 (the predecessor the forged genesis must name).
	var stored []tlog.Hash
	hr := tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			out[i] = stored[x]
		}
		return out, nil
	})
	for i, l := range e1 {
		hs, _ := tlog.StoredHashes(int64(i), l, hr)
		stored = append(stored, hs...)
	}
	root1, _ := tlog.TreeHash(int64(len(e1)), hr)

	// Forged genesis of epoch 2: epoch 1's genesis with another epoch
	// number, a predecessor, no evidence, and its statement recomputed.
	var env map[string]json.RawMessage
	json.Unmarshal(e1[0], &env)
	var body map[string]json.RawMessage
	json.Unmarshal(env["body"], &body)
	delete(body, "evidence")
	delete(body, "statement")
	body["epoch"], _ = json.Marshal("2")
	body["predecessor"], _ = json.Marshal(map[string]any{"epoch": "1", "origin": o1, "size": strconv.Itoa(len(e1)),
		"root": base64.StdEncoding.EncodeToString(root1[:]), "sealed": true})
	braw, _ := json.Marshal(body)
	bcanon, _ := digest.Canonicalize(braw)
	st, err := auditlog.StatementOf(bcanon)
	if err != nil {
		t.Fatal(err)
	}
	body["statement"], _ = json.Marshal(st.String())
	env["body"], _ = json.Marshal(body)
	graw, _ := json.Marshal(env)
	g, _ := digest.Canonicalize(graw)
	e2 := [][]byte{g}
	// Enough forged calls that the saved checkpoint's size is reached.
	for len(e2) < len(e1)+2 {
		e2 = append(e2, setSeq(t, bytes.Replace(e1[2], []byte(`"agent":"agent-a"`), []byte(`"agent":"mallory"`), 1), len(e2)))
	}
	_, anyKey, _ := ed25519.GenerateKey(rand.Reader)
	rechain(t, e2, 1, anyKey)
	os.MkdirAll(filepath.Join(dir, "epoch-000002"), 0o700)
	writeLines(t, filepath.Join(dir, "epoch-000002", "seg-000001.jsonl"), e2)

	// verify-chain refuses the epoch, and the genuine gateway refuses to
	// start on top of it.
	code, out, errOut := runCLI(t, "verify-chain", dir, "--key", k1, "--roots", f.roots, "--checkpoint", saved)
	if code != exitcode.ExitLogInteg || !strings.Contains(errOut, "does not name epoch-000002") {
		t.Fatalf("an epoch borrowing epoch 1's origin and key: exit %d\n%s%s", code, out, errOut)
	}
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	_, err = auditlog.Open(dir, auditlog.Options{Key: key})
	var te *record.TamperError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "does not name epoch-000002") {
		t.Fatalf("Open on top of the borrowed epoch: %v", err)
	}
}
