//go:build !linux

package testfix

import "time"

// ThreadCPU is the CPU time of the calling OS thread: not read on this platform (0).
func ThreadCPU() time.Duration { return 0 }
