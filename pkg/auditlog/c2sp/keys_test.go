package c2sp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogKeyFile: the log key is created once and read back; a key for
// another origin is refused.
func TestLogKeyFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state", "log.key")
	k1, err := LoadOrCreateLogKey(p, "a.example/gw")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadOrCreateLogKey(p, "a.example/gw")
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("second load: %v (same key: %v)", err, k1.Equal(k2))
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("log key mode %v, want 0600", fi.Mode().Perm())
	}
	if _, err := LoadOrCreateLogKey(p, "b.example/gw"); err == nil || !strings.Contains(err.Error(), "is for origin") {
		t.Fatalf("another origin: %v", err)
	}
}
