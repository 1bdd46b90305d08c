package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	labi "github.com/google/go-sev-guest/client/linuxabi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	stest "github.com/google/go-sev-guest/testing"
	"golang.org/x/sys/unix"

	"github.com/confidential-mcp/cmcp/internal/exitcode"
	"github.com/confidential-mcp/cmcp/internal/tee"
	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

type attestRun struct {
	code           int
	stdout, stderr string
}

func runAttestCLI(t *testing.T, dir string, args ...string) attestRun {
	t.Helper()
	var out, errb bytes.Buffer
	wd, _ := os.Getwd()
	if dir != "" {
		if err := os.Chdir(dir); err != nil {
			t.Fatal(err)
		}
		defer os.Chdir(wd)
	}
	code := Main(args, strings.NewReader(""), &out, &errb)
	if err := checkJSONOutput(args, out.Bytes()); err != nil {
		t.Error(err)
	}
	if wd, err := os.Getwd(); err == nil {
		if err := checkWrittenFiles(args, wd, code); err != nil {
			t.Error(err)
		}
	}
	return attestRun{code, out.String(), errb.String()}
}

func TestAttestSoftwareProduceVerify(t *testing.T) {
	dir := t.TempDir()
	stmt := digest.Bytes([]byte("genesis")).String()
	r := runAttestCLI(t, dir, "attest", "--nonce", "a1b2c3d4", "--statement", stmt, "--provider", "software")
	if r.code != 0 || !strings.Contains(r.stdout, "UNATTESTED") || !strings.Contains(r.stderr, "unattested") {
		t.Fatalf("attest software: %+v", r)
	}
	fi, err := os.Stat(filepath.Join(dir, "cmcp-attest-key.pem"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("generated private key: %v %v", fi, err)
	}
	// A second run never overwrites the private key.
	keyBefore, err := os.ReadFile(filepath.Join(dir, "cmcp-attest-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	r = runAttestCLI(t, dir, "attest", "--nonce", "a1b2c3d4", "--provider", "software", "--out", "other.json")
	if r.code != exitcode.ExitIO || !strings.Contains(r.stderr, "never overwritten") {
		t.Fatalf("key overwrite: %+v", r)
	}
	if keyAfter, _ := os.ReadFile(filepath.Join(dir, "cmcp-attest-key.pem")); !bytes.Equal(keyAfter, keyBefore) {
		t.Fatal("the refused run changed the private key file")
	}
	// Software evidence never verifies as hardware.
	r = runAttestCLI(t, dir, "attest", "verify", "cmcp-evidence.json")
	if r.code != exitcode.ExitEvidence || !strings.Contains(r.stdout, "UNATTESTED") || !strings.Contains(r.stderr, "--allow-software") {
		t.Fatalf("verify software: %+v", r)
	}
	key := filepath.Join(dir, "cmcp-attest-key.pem")
	r = runAttestCLI(t, dir, "attest", "verify", "cmcp-evidence.json", "--allow-software", "--nonce", "a1b2c3d4", "--key", key, "--statement", stmt)
	if r.code != 0 || !strings.Contains(r.stdout, "verdict: WARNING") {
		t.Fatalf("verify software allowed: %+v", r)
	}
	r = runAttestCLI(t, dir, "attest", "verify", "cmcp-evidence.json", "--allow-software", "--nonce", "ffff")
	if r.code != exitcode.ExitBinding || !strings.Contains(r.stderr, "not the expected nonce") {
		t.Fatalf("verify wrong nonce: %+v", r)
	}
	r = runAttestCLI(t, dir, "attest", "verify", "cmcp-evidence.json", "--allow-software", "--statement", digest.Bytes([]byte("x")).String())
	if r.code != exitcode.ExitBinding {
		t.Fatalf("verify other statement: %+v", r)
	}
	r = runAttestCLI(t, dir, "-o", "json", "attest", "verify", "cmcp-evidence.json", "--allow-software")
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || doc["platform"] != "software" || doc["attested"] != false || doc["schema_version"] == nil {
		t.Fatalf("json: %v %s", err, r.stdout)
	}
}

func TestAttestUsageAndPlainMachine(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"attest"}, exitcode.ExitUsage, "nonce is required"},
		{[]string{"attest", "--nonce", "xyz"}, exitcode.ExitUsage, "not hex"},
		{[]string{"attest", "--nonce", "00", "--statement", "md5:00"}, exitcode.ExitUsage, "--statement"},
		{[]string{"attest", "--nonce", "00", "--provider", "sgx"}, exitcode.ExitUsage, "unknown provider"},
		{[]string{"attest", "--nonce", "00", "--key", "/nonexistent"}, exitcode.ExitIO, "--key"},
		{[]string{"attest", "verify"}, exitcode.ExitUsage, "want one evidence bundle"},
		// The vendor libraries register std flags; cobra never sees them.
		{[]string{"attest", "--nonce", "00", "--sev_guest_device_path", "/x"}, exitcode.ExitUsage, "unknown flag"},
		{[]string{"attest", "verify", "x", "--tdx_guest_device_path=/x"}, exitcode.ExitUsage, "unknown flag"},
		{[]string{"attest", "verify", "a", "--raw-report", "b"}, exitcode.ExitUsage, "not both"},
		{[]string{"attest", "verify", "/nonexistent.json"}, exitcode.ExitIO, "no such file"},
		{[]string{"attest", "verify", "--raw-report", "x", "--nonce", "00"}, exitcode.ExitUsage, "raw evidence has none"},
	}
	for _, c := range cases {
		r := runAttestCLI(t, dir, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d with %q", c.args, r.code, r.stderr, c.code, c.want)
		}
	}
	if _, err := tee.Detect(tee.Options{}); err == nil {
		t.Skip("this machine has SEV-SNP or TDX")
	}
	r := runAttestCLI(t, dir, "attest", "--nonce", "00")
	for _, want := range []string{"/sys/kernel/config/tsm/report", "/dev/sev-guest", "/dev/tdx_guest", "--provider software"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("plain machine: stderr lacks %q: %s", want, r.stderr)
		}
	}
	if r.code != exitcode.ExitIO {
		t.Errorf("plain machine exit %d", r.code)
	}
	if _, err := os.Stat(filepath.Join(dir, "cmcp-attest-key.pem")); err == nil {
		t.Error("a key was generated although no evidence could be produced")
	}
}

// captureFD1 runs f with file descriptor 1 redirected to a pipe and returns
// what was written there: go-tdx-guest's logger writes to the process's
// stdout directly, bypassing Main's stdout.
func captureFD1(t *testing.T, f func()) string {
	t.Helper()
	rp, wp, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := unix.Dup(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Dup2(int(wp.Fd()), 1); err != nil {
		t.Fatal(err)
	}
	f()
	unix.Dup2(saved, 1)
	unix.Close(saved)
	wp.Close()
	var buf bytes.Buffer
	buf.ReadFrom(rp)
	return buf.String()
}

func TestAttestVerifyRawGenuine(t *testing.T) {
	ev := "../../testdata/evidence/"
	at := "--at=2025-06-01T00:00:00Z"
	var r attestRun
	leaked := captureFD1(t, func() {
		r = runAttestCLI(t, "", "-o", "json", "attest", "verify", "--raw-report", ev+"tdx-spr-e4-quote.dat", at)
	})
	if leaked != "" {
		t.Fatalf("a library wrote to the process stdout: %q", leaked)
	}
	var doc struct {
		Verdict string `json:"verdict"`
		Binding string `json:"binding"`
		Claims  []struct{ Name, Status string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || r.code != 0 || doc.Verdict != "warning" || doc.Binding != "not-applicable" {
		t.Fatalf("TDX sample: %v %+v", err, r)
	}
	// Tampered and truncated copies.
	raw, _ := os.ReadFile(ev + "tdx-spr-e4-quote.dat")
	dir := t.TempDir()
	bad := bytes.Clone(raw)
	bad[48+136] ^= 1
	os.WriteFile(filepath.Join(dir, "tampered.dat"), bad, 0o644)
	os.WriteFile(filepath.Join(dir, "short.dat"), raw[:600], 0o644)
	for _, f := range []string{"tampered.dat", "short.dat"} {
		if r := runAttestCLI(t, dir, "attest", "verify", "--raw-report", f, at); r.code != exitcode.ExitEvidence {
			t.Errorf("%s: %+v", f, r)
		}
	}
	// The genuine SEV-SNP report in go-sev-guest's testdata: chain and
	// signature verify, its debug policy is rejected; with PEM VCEK too.
	r = runAttestCLI(t, "", "attest", "verify", "--raw-report", ev+"snp-milan-v2-report.bin", "--cert", ev+"snp-milan-vcek.der", at)
	if r.code != exitcode.ExitRefValue || !strings.Contains(r.stdout, "chain to AMD ARK-Milan") || !strings.Contains(r.stderr, "allows debugging") {
		t.Fatalf("SNP genuine: %+v", r)
	}
	der, _ := os.ReadFile(ev + "snp-milan-vcek.der")
	os.WriteFile(filepath.Join(dir, "vcek.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	snp, _ := os.ReadFile(ev + "snp-milan-v2-report.bin")
	snp[0x90] ^= 1
	os.WriteFile(filepath.Join(dir, "snp-tampered.bin"), snp, 0o644)
	if r := runAttestCLI(t, dir, "attest", "verify", "--raw-report", "snp-tampered.bin", "--cert", "vcek.pem", at); r.code != exitcode.ExitEvidence {
		t.Fatalf("SNP tampered: %+v", r)
	}
	if r := runAttestCLI(t, "", "attest", "verify", "--raw-report", ev+"snp-milan-v2-report.bin", at); r.code != exitcode.ExitEvidence || !strings.Contains(r.stderr, "--cert") {
		t.Fatalf("SNP without VCEK: %+v", r)
	}
}

// A bundle produced by the SEV-SNP provider over go-sev-guest's fake AMD
// secure processor, verified by the CLI with --roots and --reference.
func TestAttestVerifySNPBundle(t *testing.T) {
	dir := t.TempDir()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	_ = priv
	nonce := []byte{0xca, 0xfe}
	stmt := digest.Bytes([]byte("genesis"))
	rd, _ := evidence.ReportData(pub, nonce, stmt)
	meas := bytes.Repeat([]byte{0x5a}, 48)
	rep := &spb.Report{
		Version: 3, Policy: abi.SnpPolicyToBytes(abi.SnpPolicy{SMT: true}), SignatureAlgo: abi.SignEcdsaP384Sha384,
		ReportData: rd[:], Measurement: meas, HostData: make([]byte, 32), FamilyId: make([]byte, 16), ImageId: make([]byte, 16),
		IdKeyDigest: make([]byte, 48), AuthorKeyDigest: make([]byte, 48), ReportId: make([]byte, 32), ReportIdMa: make([]byte, 32),
		ChipId: make([]byte, 64), Signature: make([]byte, 512), Cpuid1EaxFms: 0x00a00f10,
	}
	raw, err := abi.ReportToAbiBytes(rep)
	if err != nil {
		t.Fatal(err)
	}
	var out [labi.SnpReportRespReportSize]byte
	copy(out[:], raw)
	qp, err := stest.TcQuoteProvider([]stest.TestCase{{Name: "cli", Input: rd, Output: out}},
		&stest.DeviceOptions{Now: time.Now(), Product: abi.SevProductFromCpuid1Eax(0x00a00f10)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tee.NewSNP(qp, "test-device", nil).Attest(context.Background(), pub, nonce, stmt)
	if err != nil {
		t.Fatal(err)
	}
	if err := evidence.WriteFile(filepath.Join(dir, "ev.json"), b); err != nil {
		t.Fatal(err)
	}
	var roots bytes.Buffer
	for _, c := range [][]byte{qp.Device.Signer.Ark.Raw, qp.Device.Signer.Ask.Raw} {
		pem.Encode(&roots, &pem.Block{Type: "CERTIFICATE", Bytes: c})
	}
	os.WriteFile(filepath.Join(dir, "roots.pem"), roots.Bytes(), 0o644)
	os.WriteFile(filepath.Join(dir, "key.pub"), []byte(evidence.FormatPublicKey(pub)), 0o644)
	ref := `{"sev-snp": {"measurements": ["` + hex.EncodeToString(meas) + `"], "vmpl": 0}}`
	os.WriteFile(filepath.Join(dir, "ref.json"), []byte(ref), 0o644)
	other := `{"sev-snp": {"measurements": ["` + strings.Repeat("00", 48) + `"]}}`
	os.WriteFile(filepath.Join(dir, "other.json"), []byte(other), 0o644)
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte(`{"sev-snp": {"measurement": []}}`), 0o644)
	otherKey, _, _ := ed25519.GenerateKey(rand.Reader)
	os.WriteFile(filepath.Join(dir, "other.pub"), []byte(hex.EncodeToString(otherKey)), 0o644)

	base := []string{"attest", "verify", "ev.json", "--roots", "roots.pem", "--nonce", "cafe", "--key", "key.pub", "--statement", stmt.String()}
	cases := []struct {
		name  string
		extra []string
		code  int
		want  string
	}{
		{"good", []string{"--reference", "ref.json"}, 0, "verdict: WARNING"},
		// Without --roots (an empty --roots= is a usage error now).
		{"embedded roots only", nil, exitcode.ExitEvidence, "of the embedded roots"},
		{"wrong nonce", []string{"--nonce", "beef"}, exitcode.ExitBinding, "not the expected nonce"},
		{"wrong key", []string{"--key", "other.pub"}, exitcode.ExitBinding, "not the expected key"},
		{"measurement", []string{"--reference", "other.json"}, exitcode.ExitRefValue, "not among"},
		{"bad reference file", []string{"--reference", "bad.json"}, exitcode.ExitUsage, "unknown object member name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{}, base...)
			if c.extra == nil {
				args = slices.Delete(args, 3, 5) // --roots roots.pem
			}
			r := runAttestCLI(t, dir, append(args, c.extra...)...)
			if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.want) {
				t.Fatalf("exit %d want %d, %q not in:\n%s\n%s", r.code, c.code, c.want, r.stdout, r.stderr)
			}
		})
	}
}
