package tee

import (
	"time"

	sclient "github.com/google/go-sev-guest/client"
	tclient "github.com/google/go-tdx-guest/client"
)

// The quote providers that reach the hardware exist on Linux only (see
// quote_other.go).

func newSNPConfigfs(now func() time.Time) Provider {
	return NewSNP(&sclient.LinuxConfigFsQuoteProvider{}, "configfs-tsm", now)
}

func newSNPDevice(path string, now func() time.Time) Provider {
	return NewSNP(&sclient.LinuxIoctlQuoteProvider{}, path, now)
}

func newTDXConfigfs(now func() time.Time) Provider {
	return NewTDX(&tclient.LinuxConfigFsQuoteProvider{}, "configfs-tsm", now)
}

func newTDXDevice(path string, now func() time.Time) Provider {
	return NewTDX(nil, path, now)
}
