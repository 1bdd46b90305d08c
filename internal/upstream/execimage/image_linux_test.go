package execimage

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestSealedCopiesAreBounded: at most maxImages paths keep a sealed copy;
// the least recently used is dropped first.
func TestSealedCopiesAreBounded(t *testing.T) {
	var paths []string
	for i := 0; i < maxImages+2; i++ {
		p := filepath.Join(t.TempDir(), "server.sh")
		if err := os.WriteFile(p, fmt.Appendf(nil, "#!/bin/sh\nexit %d\n", i), 0o755); err != nil {
			t.Fatal(err)
		}
		f, _, err := Sealed(p)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		paths = append(paths, p)
		if i == 0 {
			continue
		}
		// paths[0] is used again each time: it stays, paths[1] goes first.
		f, _, err = Sealed(paths[0])
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	images.mu.Lock()
	defer images.mu.Unlock()
	if len(images.m) != maxImages || images.m[paths[0]] == nil || images.m[paths[1]] != nil || images.m[paths[len(paths)-1]] == nil {
		t.Fatalf("%d copies kept; first kept %v, second kept %v, last kept %v", len(images.m),
			images.m[paths[0]] != nil, images.m[paths[1]] != nil, images.m[paths[len(paths)-1]] != nil)
	}
}
