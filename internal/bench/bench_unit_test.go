package bench

import (
	"os"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(d, 0.50); p != 50*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(d, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if p := percentile(d[:1], 0.99); p != time.Millisecond {
		t.Errorf("p99 of one = %v", p)
	}
}

func TestPeakRSSOfThisProcess(t *testing.T) {
	rss, err := CurrentRSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	hwm, err := PeakRSS(os.Getpid()) // read second: the peak can only have grown
	if err != nil {
		t.Fatal(err)
	}
	if rss <= 0 || hwm < rss {
		t.Fatalf("VmRSS %d, VmHWM %d: want 0 < RSS <= HWM", rss, hwm)
	}
	if _, err := PeakRSS(1 << 30); err == nil {
		t.Fatal("PeakRSS of a process that does not exist succeeded")
	}
}

func TestCPUTimeOfThisProcess(t *testing.T) {
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
	}
	after, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after < before || after == 0 {
		t.Fatalf("CPU time went from %v to %v after 50ms of spinning", before, after)
	}
}

// TestRatiosArePaired: a ratio is taken within each round, then the median
// over rounds: a machine that slows down between rounds moves both sides.
func TestRatiosArePaired(t *testing.T) {
	mode := []Result{{P50: 300 * time.Microsecond, CallsPerSec: 900}, {P50: 600 * time.Microsecond, CallsPerSec: 450}, {P50: 330 * time.Microsecond, CallsPerSec: 800}}
	ref := []Result{{P50: 200 * time.Microsecond, CallsPerSec: 1000}, {P50: 400 * time.Microsecond, CallsPerSec: 500}, {P50: 300 * time.Microsecond, CallsPerSec: 1000}}
	p50, cps := ratios(mode, ref)
	if p50 != 1.5 || cps != 0.9 {
		t.Fatalf("ratios = %v, %v; want 1.5 and 0.9 (per-round 1.5/1.5/1.1 and 0.9/0.9/0.8)", p50, cps)
	}
}
