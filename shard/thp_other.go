//go:build !linux

package shard

// No huge-page tables here (see thp_linux.go): every table is on the Go heap.
func hugeTable(uint64, layout) bool { return false }

func roundBuckets(nb uint64, _ layout) uint64 { return nb }

func mapBuckets(uint64) ([]bucket, []byte, bool) { return nil, nil, false }

func unmapWhenUnreachable(*table, []byte) {}

func retireTable(*table) {}

func populate([]bucket) bool { return false }

func newSpillChunk(words int) *spillChunk { return &spillChunk{w: make([]uint64, words)} }
