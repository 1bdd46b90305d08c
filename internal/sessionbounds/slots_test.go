package sessionbounds

import (
	"log/slog"
	"strings"
	"testing"
)

// TestWarnFileLimit: serve warns at start when the sessions it allows could
// need more file descriptors than the process may open, naming the setting
// and the remedy; without per-session stdio upstreams it says nothing.
func TestWarnFileLimit(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		maxSessions, upstream int
		warns                 bool
	}{
		{"more than any limit", 1 << 40, 1, true},
		{"no per-session children", 1 << 40, 0, false},
		{"few sessions", 1, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &strings.Builder{}
			WarnFileLimit(slog.New(slog.NewTextHandler(logs, nil)), tc.maxSessions, tc.upstream)
			got := logs.String()
			if warned := strings.Contains(got, "server.max_sessions") && strings.Contains(got, "ulimit -n"); warned != tc.warns {
				t.Fatalf("warned %v, want %v: %q", warned, tc.warns, got)
			}
		})
	}
}
