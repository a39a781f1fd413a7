package testfix

import (
	"runtime"
	"testing"
	"time"
)

type metrics map[string]float64

func (m metrics) ReportMetric(n float64, unit string) { m[unit] = n }

// TestCPUClockCountsWork: a spinning loop of 20 ms of wall time shows up as CPU time on
// Linux (where the thread's clock is read), and Stop reports it per op.
func TestCPUClockCountsWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		if ThreadCPU() != 0 {
			t.Fatal("ThreadCPU: nonzero where it is not read")
		}
		return
	}
	c := StartCPUClock()
	x := 0
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
		x++
	}
	m := metrics{}
	c.Stop(m, 4)
	// At least a little of 20 ms spinning is on-CPU even on a crowded machine; rusage
	// ticks are ~1-4 ms, so only ask for > 0.
	if m["cpu-ns/op"] <= 0 || x == 0 {
		t.Fatalf("cpu-ns/op = %v after spinning", m["cpu-ns/op"])
	}
	if p := ProcessCPU(); p <= 0 {
		t.Fatalf("ProcessCPU = %d", p)
	}
}
