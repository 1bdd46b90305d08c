package digest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// genTree writes a tree shaped like a node_modules directory: files
// 100 directories × 50 files, mostly small, a few large, about 50 MB in all.
func genTree(b *testing.B) (string, int64, int) {
	b.Helper()
	dir := b.TempDir()
	src := rand.NewChaCha8([32]byte{1})
	rng := rand.New(src)
	var total int64
	files := 0
	buf := make([]byte, 1<<20)
	for d := range 100 {
		sub := filepath.Join(dir, fmt.Sprintf("pkg%03d", d), "lib")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 50 {
			size := 1024 + rng.IntN(8*1024) // 1 to 9 KiB
			if f == 0 && d%2 == 0 {
				size = 450*1024 + rng.IntN(200*1024) // 50 files of 0.45 to 0.65 MiB
			}
			src.Read(buf[:size])
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%02d.js", f)), buf[:size], 0o644); err != nil {
				b.Fatal(err)
			}
			total += int64(size)
			files++
		}
	}
	return dir, total, files
}

// BenchmarkTreeVsSha256sum measures Tree against `find DIR -type f -print0 |
// xargs -0 sha256sum` over the same files, alternating in the same run, and
// reports both throughputs and the speedup (sha256sum time / Tree time).
func BenchmarkTreeVsSha256sum(b *testing.B) {
	for _, tool := range []string{"find", "xargs", "sha256sum", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Fatalf("this benchmark compares with %s: %v", tool, err)
		}
	}
	dir, total, files := genTree(b)
	b.Logf("tree: %d files, %.1f MB", files, float64(total)/1e6)
	// Warm the page cache for both.
	if _, err := Tree(context.Background(), dir, TreeOptions{}); err != nil {
		b.Fatal(err)
	}
	var tTree, tSum time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := Tree(context.Background(), dir, TreeOptions{}); err != nil {
			b.Fatal(err)
		}
		tTree += time.Since(start)
		start = time.Now()
		cmd := exec.Command("sh", "-c", `find "$1" -type f -print0 | xargs -0 sha256sum >/dev/null`, "sh", dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("sha256sum: %v\n%s", err, out)
		}
		tSum += time.Since(start)
	}
	b.ReportMetric(float64(total)*float64(b.N)/1e6/tTree.Seconds(), "tree-MB/s")
	b.ReportMetric(float64(total)*float64(b.N)/1e6/tSum.Seconds(), "sha256sum-MB/s")
	b.ReportMetric(tSum.Seconds()/tTree.Seconds(), "speedup")
}

// BenchmarkTreeWorkers shows how Tree scales with the number of workers.
func BenchmarkTreeWorkers(b *testing.B) {
	dir, total, _ := genTree(b)
	for _, w := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			b.SetBytes(total)
			for b.Loop() {
				if _, err := Tree(context.Background(), dir, TreeOptions{Workers: w}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
