package shard

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testfix"
)

// BenchmarkFleet measures a 1,024-endpoint rule (sparse sets) at fleet sizes, counted in
// (key, endpoint) entries, the unit a fleet's memory scales with. Workload (fleetHolders):
// most blocks are held by one to four engines, a few (4%) by 8 or 32 (hot shared
// prefixes, which spill to a bitmask); 2.3 holders per key on average. Per size:
//
//   - memory: B/entry from MemoryBytes and from the Go heap after a GC (target <= 25);
//   - score: a 512-key overlap Score (8,192 tokens at block 16; 384 keys held, 128 not)
//     over all 1,024 endpoints, 256 distinct prompts rotated (target <= 80 us, 0 allocs);
//   - add-churn: one writer's 16-key BlockStored batches of fresh single-holder keys,
//     each matched by removing the oldest churn batch, so the size stays put (target
//     >= 5M keys/s per core; Mkeys/cpu-s is keys added per CPU second of the process,
//     Mapplied/cpu-s counts the removes too).
//
// Sizes: 10M and 30M entries; FLEET_ENTRIES=10M,30M,100M (M = 1e6) picks others, e.g.
// FLEET_ENTRIES=100M go test -run '^$' -bench Fleet -benchtime 2s ./shard (about 2 GB
// of heap while filling at 100M). FLEET_SHARDS sets Config.Shards (default: from
// GOMAXPROCS, 8 on 2 cores, so at 100M a shard's rebuild re-inserts ~5M keys).
func BenchmarkFleet(b *testing.B) {
	for _, entries := range fleetSizes(b) {
		inv, keys := fillFleet(b, entries)
		label := fmt.Sprintf("endpoints=%d/entries=%dM", fleetEndpoints, entries/1e6)
		b.Run(label+"/memory", func(b *testing.B) {
			for b.Loop() {
				// Nothing to time: the figures are of the fill above.
			}
			b.ReportMetric(float64(inv.MemoryBytes())/float64(entries), "B/entry")
			b.ReportMetric(float64(inv.MemoryBytes())/float64(inv.Len()), "B/key")
			b.ReportMetric(float64(inv.Stats().Spilled)/float64(inv.Len())*100, "%spilled")
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapAlloc)/float64(entries), "heap-B/entry")
		})
		b.Run(label+"/score", func(b *testing.B) {
			qs := make([][]uint64, benchQueryCount)
			for v := range qs {
				q := make([]uint64, 0, benchQueryLen)
				for i := uint64(v)*7919 + 1; len(q) < benchQueryHit; i += 104729 {
					q = append(q, fleetKey(i%keys))
				}
				for i := uint64(0); len(q) < benchQueryLen; i++ {
					q = append(q, fleetKey(1<<50+uint64(v)*benchQueryLen+i))
				}
				qs[v] = q
			}
			elig := NewMask(fleetEndpoints)
			elig.SetAll(fleetEndpoints)
			scores := make([]int32, fleetEndpoints)
			b.ReportAllocs()
			cpu0 := testfix.ProcessCPU()
			i := 0
			for b.Loop() {
				inv.Score(qs[i%benchQueryCount], elig, Overlap, scores)
				i++
			}
			reportPerKey(b, benchQueryLen, cpu0)
			sum := int32(0)
			for _, s := range scores {
				sum += s
			}
			if sum < benchQueryHit {
				b.Fatalf("overlap sum %d, want >= %d (every held key has a holder)", sum, benchQueryHit)
			}
		})
		b.Run(label+"/add-churn", func(b *testing.B) {
			const batchLen = 16
			batch := make([]uint64, batchLen)
			fillBatch := func(start uint64) []uint64 {
				for i := range batch {
					batch[i] = fleetKey(1<<52 + start + uint64(i))
				}
				return batch
			}
			// A ring of fleetChurnRing single-holder keys, added once, then churned.
			oldest, next := uint64(0), uint64(0)
			for ; next < fleetChurnRing; next += batchLen {
				inv.Add(int(next/batchLen)%fleetEndpoints, fillBatch(next))
			}
			b.ReportAllocs()
			cpu0 := testfix.ProcessCPU()
			for b.Loop() {
				inv.Add(int(next/batchLen)%fleetEndpoints, fillBatch(next))
				next += batchLen
				inv.Remove(int(oldest/batchLen)%fleetEndpoints, fillBatch(oldest))
				oldest += batchLen
			}
			reportKeysPerSec(b, batchLen, cpu0)
			// Events apply removes as well as adds: count both, per CPU second.
			if cpu := testfix.ProcessCPU() - cpu0; cpu > 0 {
				b.ReportMetric(float64(2*b.N*batchLen)/(float64(cpu)/1e9)/1e6, "Mapplied/cpu-s")
			}
		})
		inv = nil
		runtime.GC()
	}
}

const (
	fleetEndpoints = 1024
	fleetChurnRing = 1 << 18
)

func fleetSizes(b *testing.B) []int {
	spec := os.Getenv("FLEET_ENTRIES")
	if spec == "" {
		return []int{10e6, 30e6}
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(f), "M"))
		if err != nil || n <= 0 {
			b.Fatalf("FLEET_ENTRIES: %q is not a count of millions like 30M", f)
		}
		out = append(out, n*1e6)
	}
	return out
}

// fleetKey is the i-th key of the fleet workload (a salted benchKey, so fleet keys never
// meet the other benchmarks' keys).
func fleetKey(i uint64) uint64 { return benchKey(i ^ 0x5bd1e995<<32) }

// fleetHolders appends key i's holders to dst: 1 (45%), 2 (30%), 3 (15%), 4 (6%),
// 8 (3%) or 32 (1%) distinct endpoints, spread by the key's hash.
func fleetHolders(dst []int, i uint64) []int {
	h := benchKey(i ^ 0x9e37<<48)
	var n int
	switch p := h % 100; {
	case p < 45:
		n = 1
	case p < 75:
		n = 2
	case p < 90:
		n = 3
	case p < 96:
		n = 4
	case p < 99:
		n = 8
	default:
		n = 32
	}
	first, stride := int(h>>20)%fleetEndpoints, 1+2*(int(h>>40)%(fleetEndpoints/2-1)) // odd: distinct mod 1024
	for j := 0; j < n; j++ {
		dst = append(dst, (first+j*stride)%fleetEndpoints)
	}
	return dst
}

// fillFleet adds keys until the inventory holds entries (key, endpoint) pairs, in
// per-endpoint batches of 64 as BlockStored events would bring them, and returns it with
// the number of keys used.
func fillFleet(tb testing.TB, entries int) (*Inventory, uint64) {
	shards, _ := strconv.Atoi(os.Getenv("FLEET_SHARDS")) // 0: sized from GOMAXPROCS
	inv, err := New(Config{Endpoints: fleetEndpoints, Shards: shards})
	if err != nil {
		tb.Fatal(err)
	}
	batches := make([][]uint64, fleetEndpoints)
	var holders []int
	n, i := 0, uint64(0)
	for ; n < entries; i++ {
		holders = fleetHolders(holders[:0], i)
		for _, ep := range holders {
			if batches[ep] = append(batches[ep], fleetKey(i)); len(batches[ep]) == 64 {
				inv.Add(ep, batches[ep])
				batches[ep] = batches[ep][:0]
			}
		}
		n += len(holders)
	}
	for ep := range batches {
		inv.Add(ep, batches[ep])
	}
	return inv, i
}

// TestFleetWorkloadShape pins what BenchmarkFleet claims of its workload (distinct
// holders per key, about 2.3 of them, 4% of keys spilled) and the memory target.
func TestFleetWorkloadShape(t *testing.T) {
	inv, keys := fillFleet(t, 200_000)
	total := 0
	for ep := 0; ep < fleetEndpoints; ep++ {
		total += inv.Count(ep)
	}
	if total < 200_000 || total > 200_000+32 {
		t.Fatalf("entries %d, want 200000 (+ the last key's holders)", total)
	}
	if got := float64(total) / float64(keys); got < 2.1 || got > 2.5 {
		t.Errorf("%.2f holders per key, want about 2.3", got)
	}
	if sp := float64(inv.Stats().Spilled) / float64(keys); sp < 0.03 || sp > 0.05 {
		t.Errorf("%.1f%% of keys spilled, want about 4%%", sp*100)
	}
	if inv.Len() != int(keys) {
		t.Errorf("Len %d, want %d keys (holders must be distinct)", inv.Len(), keys)
	}
	// The memory target, <= 25 B per (key, endpoint) entry, holds at this size too.
	if bpe := float64(inv.MemoryBytes()) / float64(total); bpe > 25 {
		t.Errorf("%.1f B/entry, target <= 25", bpe)
	}
}
