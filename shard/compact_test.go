package shard

import (
	"slices"
	"testing"
)

// TestCompactionsSpreadOut: under steady churn (each step stores new keys and removes as
// many of the oldest), shards of equal size would all reach their compaction trigger
// together; with compactTrigger's spread, their first compactions fall over a range of
// the churn, not within a short stretch of it. Measured: the most first compactions in
// any window of a tenth of the span from the churn's start to the median one.
func TestCompactionsSpreadOut(t *testing.T) {
	const shards, perShard, batch = 64, 4000, 64
	inv, err := New(Config{Endpoints: 8, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	fresh := freshKeys()
	var held [][]uint64
	for range shards * perShard / batch {
		k := fresh(batch)
		inv.Add(1, k)
		held = append(held, k)
	}
	tabs := make([]*table, shards)
	for s := range tabs {
		tabs[s] = inv.tabs[s].Load()
	}
	first := make([]int, shards)
	for s := range first {
		first[s] = -1
	}
	for step, left := 0, shards; left > 0 && step < 100000; step++ {
		k := fresh(batch)
		inv.Add(1, k)
		inv.Remove(1, held[0])
		held = append(held[1:], k)
		for s := range tabs {
			if first[s] < 0 && inv.tabs[s].Load() != tabs[s] {
				first[s] = step
				left--
			}
		}
	}
	if slices.Contains(first, -1) {
		t.Fatalf("some shards never compacted: %v", first)
	}
	sorted := slices.Clone(first)
	slices.Sort(sorted)
	width := max(sorted[shards/2]/10, 1)
	most := 0
	for i, lo := range sorted {
		j, _ := slices.BinarySearch(sorted, lo+width)
		most = max(most, j-i)
	}
	t.Logf("first compactions from step %d to %d (median %d); at most %d of %d shards within %d steps",
		sorted[0], sorted[shards-1], sorted[shards/2], most, shards, width)
	if most > shards/3 {
		t.Fatalf("%d of %d shards compacted within %d steps (a tenth of the way to the median)", most, shards, width)
	}
}

// freshKeys returns a source of keys never handed out before (benchKey of 1, 2, ...).
func freshKeys() func(n int) []uint64 {
	var next uint64 = 1
	return func(n int) []uint64 {
		k := make([]uint64, n)
		for i := range k {
			k[i] = benchKey(next)
			next++
		}
		return k
	}
}
