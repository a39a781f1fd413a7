//go:build unix

package testfix

import "syscall"

// ProcessCPU is the CPU time this process has used, in nanoseconds (0 where it cannot be
// read). Benchmarks report work per CPU second beside wall time, since the shared machine
// they run on often has more runnable threads than cores; GC and helper goroutines count.
func ProcessCPU() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
