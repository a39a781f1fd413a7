package shard

import "unsafe"

// prefetch asks the CPU to bring the cache line at p into cache and returns at once
// (PREFETCHT0). Why not a load whose value is dropped: a load stays in the reorder
// buffer until its data arrives, so a few outstanding misses fill the buffer and stall
// the probes behind them; a prefetch retires immediately, so a window of them keeps as
// many misses (and page walks) in flight as the core can track. p is never dereferenced
// by Go code here and a prefetch cannot fault.
//
//go:noescape
func prefetch(p unsafe.Pointer)

// prefetchLines prefetches the cache lines at lines[0:n], the window's home buckets, in
// one call. Why one call for all of them: an assembly function is never inlined, and Go
// has no callee-saved registers, so every call makes the loop around it spill and reload
// what it keeps in registers; a call per key cost a cache-resident table's probes more
// than the prefetch saved (bench/RESULTS.md, Session 5).
//
//go:noescape
func prefetchLines(lines *unsafe.Pointer, n int)
