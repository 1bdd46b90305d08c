// Package tee produces attestation evidence on the machine cmcp runs on: AMD
// SEV-SNP through go-sev-guest, Intel TDX through go-tdx-guest (configfs-tsm
// first, then the guest device), and a "software" provider for development
// whose evidence is unattested. Detect chooses the provider from the
// configfs-tsm "provider" field, then from the guest devices present.
package tee

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/go-configfs-tsm/configfs/configfsi"
	"github.com/google/go-configfs-tsm/configfs/linuxtsm"
	"github.com/google/go-configfs-tsm/report"

	"github.com/confidential-mcp/cmcp/pkg/digest"
	"github.com/confidential-mcp/cmcp/pkg/evidence"
)

// Provider produces an evidence bundle whose report data binds pub, nonce and
// statement (see evidence.ReportData).
type Provider interface {
	// Platform is evidence.PlatformSEVSNP, PlatformTDX or PlatformSoftware.
	Platform() string
	// Collector says how evidence is obtained, e.g. "configfs-tsm" or "/dev/sev-guest".
	Collector() string
	// Attest returns a bundle binding pub, nonce and statement (statement may be zero).
	Attest(ctx context.Context, pub ed25519.PublicKey, nonce []byte, statement digest.Digest) (*evidence.Bundle, error)
}

// Provider names accepted by Detect.
const (
	Auto     = "auto"
	SEVSNP   = evidence.PlatformSEVSNP
	TDX      = evidence.PlatformTDX
	Software = evidence.PlatformSoftware
)

// Names lists the provider names Detect accepts.
var Names = []string{Auto, SEVSNP, TDX, Software}

// Default probe locations.
const (
	ConfigfsReport = "/sys/kernel/config/tsm/report"
	SEVGuestDevice = "/dev/sev-guest"
	TDXGuestDevice = "/dev/tdx_guest"
)

// Options configure Detect. The zero value probes the real machine.
type Options struct {
	// Provider is auto (default), sev-snp, tdx or software.
	Provider string
	// Configfs replaces the kernel's configfs-tsm (tests: go-configfs-tsm's faketsm).
	Configfs configfsi.Client
	// SEVDevice and TDXDevice override the probed device paths (tests).
	SEVDevice, TDXDevice string
	// Now is the clock for collected_at (default time.Now).
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.Provider == "" {
		o.Provider = Auto
	}
	if o.SEVDevice == "" {
		o.SEVDevice = SEVGuestDevice
	}
	if o.TDXDevice == "" {
		o.TDXDevice = TDXGuestDevice
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// NoHardwareError is returned by Detect when no SEV-SNP or TDX interface was
// found. Probes says what was looked at and what was found.
type NoHardwareError struct {
	Wanted string
	Probes []string
}

func (e *NoHardwareError) Error() string {
	what := "no SEV-SNP or TDX attestation interface found"
	if e.Wanted != Auto {
		what = fmt.Sprintf("no %s attestation interface found", e.Wanted)
	}
	return fmt.Sprintf("%s (probed %s)", what, strings.Join(e.Probes, "; "))
}

// Hints implements the exitcode.Hinter convention.
func (e *NoHardwareError) Hints() []string {
	return []string{
		"run inside an AMD SEV-SNP or Intel TDX confidential VM whose kernel exposes configfs-tsm or the guest device",
		"for development, --provider software produces evidence labelled unattested (it never verifies as hardware)",
	}
}

// Detect returns the provider for this machine. With Provider "auto" it reads
// the configfs-tsm "provider" field (sev_guest or tdx_guest), then looks for
// /dev/sev-guest and /dev/tdx_guest. It never falls back to software on its
// own: that has to be asked for.
func Detect(opts Options) (Provider, error) {
	opts.defaults()
	switch opts.Provider {
	case Software:
		return NewSoftware(opts.Now), nil
	case Auto, SEVSNP, TDX:
	default:
		return nil, fmt.Errorf("unknown provider %q: want one of %s", opts.Provider, strings.Join(Names, ", "))
	}
	var probes []string
	want := func(p string) bool { return opts.Provider == Auto || opts.Provider == p }

	tsmName, err := configfsProvider(opts.Configfs)
	switch {
	case err != nil:
		probes = append(probes, fmt.Sprintf("%s: %v", ConfigfsReport, err))
	case tsmName == "sev_guest" && want(SEVSNP):
		return newSNPConfigfs(opts.Now), nil
	case tsmName == "tdx_guest" && want(TDX):
		return newTDXConfigfs(opts.Now), nil
	default:
		probes = append(probes, fmt.Sprintf("%s: provider %q", ConfigfsReport, tsmName))
	}
	if want(SEVSNP) {
		if err := probeDevice(opts.SEVDevice); err != nil {
			probes = append(probes, err.Error())
		} else {
			return newSNPDevice(opts.SEVDevice, opts.Now), nil
		}
	}
	if want(TDX) {
		if err := probeDevice(opts.TDXDevice); err != nil {
			probes = append(probes, err.Error())
		} else {
			return newTDXDevice(opts.TDXDevice, opts.Now), nil
		}
	}
	return nil, &NoHardwareError{Wanted: opts.Provider, Probes: probes}
}

func probeDevice(path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s: not present", path)
	}
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	if fi.Mode()&os.ModeDevice == 0 {
		return fmt.Errorf("%s: not a device", path)
	}
	return nil
}

// configfsProvider creates a configfs-tsm report entry, reads its "provider"
// attribute and removes the entry again. c nil means the kernel's configfs.
func configfsProvider(c configfsi.Client) (string, error) {
	if c == nil {
		if _, err := os.Stat(ConfigfsReport); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return "", errors.New("not present")
			}
			return "", err
		}
		lc, err := linuxtsm.MakeClient()
		if err != nil {
			return "", err
		}
		c = lc
	}
	r, err := report.Create(c, &report.Request{})
	if err != nil {
		return "", fmt.Errorf("create report entry: %w", err)
	}
	defer r.Destroy()
	p, err := r.ReadOption("provider")
	if err != nil {
		return "", fmt.Errorf("read provider: %w", err)
	}
	return strings.TrimSpace(string(p)), nil
}

func reportDataFor(pub ed25519.PublicKey, nonce []byte, statement digest.Digest) (evidence.Binding, [64]byte, error) {
	b, err := evidence.NewBinding(pub, nonce, statement)
	if err != nil {
		return evidence.Binding{}, [64]byte{}, err
	}
	var rd [64]byte
	copy(rd[:], b.ReportData)
	return b, rd, nil
}
