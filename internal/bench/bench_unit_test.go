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
