//go:build unix

package ingest

import "syscall"

// processCPU is the CPU time this process has used, in nanoseconds. Benchmarks report
// work per CPU second beside wall time, since the shared machine they run on often has
// more runnable threads than cores.
func processCPU() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
