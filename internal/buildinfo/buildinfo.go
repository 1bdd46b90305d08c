// Package buildinfo holds the version, commit and build date stamped into the
// cmcp binary by the release build (-ldflags -X), with a "devel" fallback.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Set by the release build:
//
//	-ldflags "-X github.com/confidential-mcp/cmcp/internal/buildinfo.Version=v1.2.3
//	          -X github.com/confidential-mcp/cmcp/internal/buildinfo.Commit=abc123
//	          -X github.com/confidential-mcp/cmcp/internal/buildinfo.Date=2026-01-02T03:04:05Z"
var (
	Version = ""
	Commit  = ""
	Date    = ""
)

// Info describes the running binary.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Date      string `json:"date"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

// Get returns the build information, falling back to the module build info
// and then to "devel" / "unknown" where the linker stamped nothing.
func Get() Info {
	in := Info{Version: Version, Commit: Commit, Date: Date, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if in.Commit == "" {
					in.Commit = s.Value
				}
			case "vcs.time":
				if in.Date == "" {
					in.Date = s.Value
				}
			}
		}
	}
	if in.Version == "" {
		in.Version = "devel"
	}
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	if in.Date == "" {
		in.Date = "unknown"
	}
	return in
}
