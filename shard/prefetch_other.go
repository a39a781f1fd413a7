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
