package bench

import (
	"syscall"
	"time"
)

// threadCPUTime is the CPU time of the calling OS thread. On a shared machine it is a
// steadier measure than wall time: time spent descheduled does not count.
func threadCPUTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
