//go:build !linux

package hashcore

import "time"

func threadCPUTime() time.Duration { return 0 }
