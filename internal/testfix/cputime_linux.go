package testfix

import (
	"syscall"
	"time"
)

// ThreadCPU is the CPU time of the calling OS thread (0 where it cannot be read).
func ThreadCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
