//go:build !amd64

package shard

import (
	"sync/atomic"
	"unsafe"
)

// prefetch touches the cache line at p (the portable form of prefetch_amd64's
// instruction: a load whose value is dropped, which the compiler keeps since atomic
// loads order memory). p must point into a live bucket.
func prefetch(p unsafe.Pointer) { _ = atomic.LoadUint64((*uint64)(p)) }

// prefetchLines touches the cache lines at lines[0:n] (prefetch_amd64.go's, portably).
func prefetchLines(lines *unsafe.Pointer, n int) {
	for _, p := range unsafe.Slice(lines, n) {
		prefetch(p)
	}
}
