//go:build !unix

package bench

import "time"

// selfCPU is 0 where getrusage(2) is missing: the fleet's runner CPU column reads 0.
func selfCPU() time.Duration { return 0 }
