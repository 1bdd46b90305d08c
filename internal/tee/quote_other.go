//go:build !linux

package tee

import (
	"fmt"
	"runtime"
	"time"

	"github.com/google/go-sev-guest/proto/sevsnp"
)

// SEV-SNP and TDX guests run Linux: on other systems (cmcp built for an
// auditor's macOS machine, say) the hardware providers refuse with an error
// that says so. Verification of evidence works everywhere.

func newSNPConfigfs(now func() time.Time) Provider {
	return NewSNP(noSNP{}, "configfs-tsm", now)
}

func newSNPDevice(path string, now func() time.Time) Provider {
	return NewSNP(noSNP{}, path, now)
}

func newTDXConfigfs(now func() time.Time) Provider {
	return NewTDX(nil, "configfs-tsm", now)
}

func newTDXDevice(path string, now func() time.Time) Provider {
	return NewTDX(nil, path, now)
}

// noSNP is the SEV-SNP quote provider of a system that cannot have one.
type noSNP struct{}

func (noSNP) IsSupported() bool { return false }

func (noSNP) GetRawQuote([64]byte) ([]uint8, error) {
	return nil, fmt.Errorf("SEV-SNP attestation needs a Linux guest (configfs-tsm or /dev/sev-guest); this is %s", runtime.GOOS)
}

func (noSNP) Product() *sevsnp.SevProduct { return nil }
