package tee

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-configfs-tsm/configfs/configfsi"
	"github.com/google/go-configfs-tsm/configfs/faketsm"

	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

func TestSoftwareProvider(t *testing.T) {
	pub := ed25519.PublicKey(bytes.Repeat([]byte{3}, 32))
	stmt := digest.Bytes([]byte("genesis"))
	fixed := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	p, err := Detect(Options{Provider: Software, Now: func() time.Time { return fixed }})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Attest(context.Background(), pub, []byte("n0nce"), stmt)
	if err != nil {
		t.Fatal(err)
	}
	if b.Platform != evidence.PlatformSoftware || b.Attested || b.Note != evidence.SoftwareLabel || b.Evidence != nil {
		t.Fatalf("software bundle not labelled unattested: %+v", b)
	}
	rd, _ := evidence.ReportData(pub, []byte("n0nce"), stmt)
	if !bytes.Equal(b.Binding.ReportData, rd[:]) || !b.CollectedAt.Equal(fixed) {
		t.Fatalf("binding %x, want %x", b.Binding.ReportData, rd)
	}
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := evidence.Decode(data); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Attest(context.Background(), pub[:5], nil, stmt); err == nil {
		t.Fatal("short key accepted")
	}
}

// On a machine without SEV-SNP or TDX (this one, and CI), Detect names what
// it probed and points at --provider software.
func TestDetectPlainMachine(t *testing.T) {
	for _, want := range []string{Auto, SEVSNP, TDX} {
		_, err := Detect(Options{Provider: want, SEVDevice: "/nonexistent/sev-guest", TDXDevice: "/nonexistent/tdx_guest",
			Configfs: tsmWith("")})
		var nh *NoHardwareError
		if !errors.As(err, &nh) {
			t.Fatalf("%s: Detect = %v, want NoHardwareError", want, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, ConfigfsReport) {
			t.Errorf("%s: error does not name configfs: %s", want, msg)
		}
		if (want != TDX) != strings.Contains(msg, "/nonexistent/sev-guest: not present") {
			t.Errorf("%s: sev-guest probe: %s", want, msg)
		}
		if (want != SEVSNP) != strings.Contains(msg, "/nonexistent/tdx_guest: not present") {
			t.Errorf("%s: tdx_guest probe: %s", want, msg)
		}
		if !strings.Contains(strings.Join(nh.Hints(), "\n"), "--provider software") {
			t.Errorf("hints do not mention --provider software: %q", nh.Hints())
		}
	}
	if _, err := Detect(Options{Provider: "sgx"}); err == nil || !strings.Contains(err.Error(), "unknown provider") {
		t.Fatalf("unknown provider: %v", err)
	}
}

// The real probes on this machine: no configfs-tsm, no devices.
func TestDetectRealMachineHasNoHardware(t *testing.T) {
	p, err := Detect(Options{})
	if err == nil {
		t.Logf("this machine has %s via %s", p.Platform(), p.Collector())
		return
	}
	for _, probe := range []string{ConfigfsReport, SEVGuestDevice, TDXGuestDevice} {
		if !strings.Contains(err.Error(), probe) {
			t.Errorf("error does not name %s: %v", probe, err)
		}
	}
}

// tsmWith returns go-configfs-tsm's fake configfs whose report entries
// report the given provider ("" keeps the fake's own "fake").
func tsmWith(provider string) configfsi.Client {
	sub := faketsm.Report611(0)
	if provider != "" {
		// The kernel's entries show "provider" from creation on.
		mk := sub.MakeEntry
		sub.MakeEntry = func() *faketsm.ReportEntry {
			e := mk()
			e.ROAttrs = map[string][]byte{"provider": []byte(provider + "\n")}
			return e
		}
	}
	return &faketsm.Client{Subsystems: map[string]configfsi.Client{"report": sub}}
}

func TestDetectChoosesByConfigfsProvider(t *testing.T) {
	cases := []struct {
		tsm, want, platform, collector string
		err                            bool
	}{
		{"sev_guest", Auto, evidence.PlatformSEVSNP, "configfs-tsm", false},
		{"tdx_guest", Auto, evidence.PlatformTDX, "configfs-tsm", false},
		{"tdx_guest", SEVSNP, "", "", true}, // the configfs says TDX: SEV-SNP was asked for
		{"sev_guest", TDX, "", "", true},
		{"", Auto, "", "", true}, // provider "fake"
	}
	for _, c := range cases {
		p, err := Detect(Options{Provider: c.want, Configfs: tsmWith(c.tsm), SEVDevice: "/nonexistent/a", TDXDevice: "/nonexistent/b"})
		if c.err {
			if err == nil {
				t.Errorf("tsm %q want %s: got provider %s", c.tsm, c.want, p.Platform())
			}
			continue
		}
		if err != nil {
			t.Fatalf("tsm %q: %v", c.tsm, err)
		}
		if p.Platform() != c.platform || p.Collector() != c.collector {
			t.Errorf("tsm %q: got %s via %s, want %s via %s", c.tsm, p.Platform(), p.Collector(), c.platform, c.collector)
		}
	}
}

// Without configfs-tsm the guest devices decide. /dev/null stands in for a
// device node; only the choice is tested here.
func TestDetectFallsBackToDevices(t *testing.T) {
	p, err := Detect(Options{Configfs: tsmWith(""), SEVDevice: "/dev/null", TDXDevice: "/nonexistent/b"})
	if err != nil || p.Platform() != evidence.PlatformSEVSNP || p.Collector() != "/dev/null" {
		t.Fatalf("got %v, %v", p, err)
	}
	p, err = Detect(Options{Configfs: tsmWith(""), SEVDevice: "/nonexistent/a", TDXDevice: "/dev/null"})
	if err != nil || p.Platform() != evidence.PlatformTDX {
		t.Fatalf("got %v, %v", p, err)
	}
	_, err = Detect(Options{Configfs: tsmWith(""), SEVDevice: t.TempDir(), TDXDevice: "/nonexistent/b"})
	if err == nil || !strings.Contains(err.Error(), "not a device") {
		t.Fatalf("directory accepted as device: %v", err)
	}
}
