package testfix

import (
	"runtime"
	"time"
)

// Reporter is the part of testing.B that reports a metric.
type Reporter interface {
	ReportMetric(n float64, unit string)
}

// CPUClock reports "cpu-ns/op", the benchmark thread's CPU time per op, next to the wall
// time: on a shared machine, time spent descheduled does not count, so compare by it.
// StartCPUClock pins the goroutine to its thread until Stop; start it right before the
// timed loop and stop it right after.
type CPUClock struct{ t0 time.Duration }

// StartCPUClock starts a CPUClock on the calling goroutine's thread.
func StartCPUClock() CPUClock {
	runtime.LockOSThread()
	return CPUClock{ThreadCPU()}
}

// Stop reports the CPU time since StartCPUClock over n ops (b.N) to b.
func (c CPUClock) Stop(b Reporter, n int) {
	if t := ThreadCPU(); t > 0 && n > 0 {
		b.ReportMetric(float64(t-c.t0)/float64(n), "cpu-ns/op")
	}
	runtime.UnlockOSThread()
}
