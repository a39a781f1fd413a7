//go:build !linux

package shard

// hugeBuckets: no huge-page tables here (see thp_linux.go); every table is on the Go heap.
const hugeBuckets = 1 << 62

func roundBuckets(nb uint64) uint64 { return nb }

func mapBuckets(uint64) ([]bucket, []byte, bool) { return nil, nil, false }

func unmapWhenUnreachable(*table, []byte) {}
