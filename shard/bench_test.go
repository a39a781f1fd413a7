package shard

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/kvgate/kvgate/internal/testfix"
)

// The benchmarks run the same workloads on the inventory and on two baselines, a
// map[uint64]uint64 of masks behind a sync.RWMutex and an xsync.MapOf, so the ratios show
// what the design buys.
//
// Workload: an inventory of N unique keys over 8 endpoints; key i is held by endpoint
// i%8 and, one time in four, by a second endpoint. A query is a 512-key chain: 384 keys
// endpoint 3 holds (some also held by others), then 128 keys nobody holds, as a prompt
// whose first three quarters are cached somewhere.

const (
	benchEndpoints = 8
	benchQueryLen  = 512
	benchQueryHit  = 384
)

// benchKey is the i-th key of the synthetic inventory (splitmix64, so keys need no slice).
func benchKey(i uint64) uint64 {
	z := i*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// benchMask is the endpoint mask of key i.
func benchMask(i uint64) uint64 {
	m := uint64(1) << (i % benchEndpoints)
	if h := benchKey(i ^ 1<<62); h&3 == 0 {
		m |= 1 << (h >> 8 % benchEndpoints)
	}
	return m
}

// benchQueries returns benchQueryCount distinct queries, so a benchmark that rotates
// through them touches ~16 MiB of index per round, as a stream of different prompts
// would, instead of re-reading one query's cache-resident slots.
func benchQueries(n uint64) [][]uint64 {
	qs := make([][]uint64, benchQueryCount)
	for v := range qs {
		q := make([]uint64, 0, benchQueryLen)
		for i := uint64(3 + 8*v); len(q) < benchQueryHit; i += benchEndpoints * 509 {
			q = append(q, benchKey(i%n))
		}
		for i := uint64(0); len(q) < benchQueryLen; i++ {
			q = append(q, benchKey(n+1000+uint64(v)*benchQueryLen+i))
		}
		qs[v] = q
	}
	return qs
}

const benchQueryCount = 256

func fillInventory(tb testing.TB, n uint64) *Inventory {
	inv, err := New(Config{Endpoints: benchEndpoints})
	if err != nil {
		tb.Fatal(err)
	}
	var batch [benchEndpoints][]uint64
	for i := uint64(0); i < n; i++ {
		for m := benchMask(i); m != 0; m &= m - 1 {
			ep := bits.TrailingZeros64(m)
			if batch[ep] = append(batch[ep], benchKey(i)); len(batch[ep]) == 64 {
				inv.Add(ep, batch[ep])
				batch[ep] = batch[ep][:0]
			}
		}
	}
	for ep := range batch {
		inv.Add(ep, batch[ep])
	}
	return inv
}

type rwMap struct {
	mu sync.RWMutex
	m  map[uint64]uint64
}

func fillRWMap(n uint64) *rwMap {
	r := &rwMap{m: make(map[uint64]uint64)}
	for i := uint64(0); i < n; i++ {
		r.m[benchKey(i)] |= benchMask(i)
	}
	return r
}

func fillXsync(n uint64) *xsync.MapOf[uint64, uint64] {
	m := xsync.NewMapOf[uint64, uint64]()
	for i := uint64(0); i < n; i++ {
		m.Store(benchKey(i), benchMask(i))
	}
	return m
}

// The baselines score with the same loops as the inventory's fast path.

func (r *rwMap) score(keys []uint64, e uint64, mode Mode, scores []int32) {
	clear(scores)
	r.mu.RLock()
	defer r.mu.RUnlock()
	run := e
	for j, k := range keys {
		m := r.m[k]
		if mode == Overlap {
			for m &= e; m != 0; m &= m - 1 {
				scores[bits.TrailingZeros64(m)]++
			}
			continue
		}
		m &= run
		for gone := run &^ m; gone != 0; gone &= gone - 1 {
			scores[bits.TrailingZeros64(gone)] = int32(j)
		}
		if run = m; run == 0 {
			return
		}
	}
	for ; mode == Prefix && run != 0; run &= run - 1 {
		scores[bits.TrailingZeros64(run)] = int32(len(keys))
	}
}

func scoreXsync(xm *xsync.MapOf[uint64, uint64], keys []uint64, e uint64, mode Mode, scores []int32) {
	clear(scores)
	run := e
	for j, k := range keys {
		m, _ := xm.Load(k)
		if mode == Overlap {
			for m &= e; m != 0; m &= m - 1 {
				scores[bits.TrailingZeros64(m)]++
			}
			continue
		}
		m &= run
		for gone := run &^ m; gone != 0; gone &= gone - 1 {
			scores[bits.TrailingZeros64(gone)] = int32(j)
		}
		if run = m; run == 0 {
			return
		}
	}
	for ; mode == Prefix && run != 0; run &= run - 1 {
		scores[bits.TrailingZeros64(run)] = int32(len(keys))
	}
}

var (
	bench1MOnce, baseline1MOnce sync.Once
	bench1M                     struct {
		inv *Inventory
		rw  *rwMap
		xm  *xsync.MapOf[uint64, uint64]
	}
)

// inventory1M and baselines1M build the 1M-key indexes once per process; the baselines
// only when a baseline runs, since their heap slows every benchmark after them (the
// xsync map is a million small pointer-holding objects for the GC to mark).
func inventory1M(tb testing.TB) {
	bench1MOnce.Do(func() { bench1M.inv = fillInventory(tb, 1<<20) })
}

func baselines1M() {
	baseline1MOnce.Do(func() {
		bench1M.rw = fillRWMap(1 << 20)
		bench1M.xm = fillXsync(1 << 20)
	})
}

// reportPerKey reports wall and process-CPU nanoseconds per key looked up (cpu0 is
// testfix.ProcessCPU() when the timed loop started). On a shared machine wall time includes time
// the benchmark was runnable but not running; CPU time does not.
func reportPerKey(b *testing.B, keysPerOp int, cpu0 int64) {
	keys := float64(b.N) * float64(keysPerOp)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/keys, "ns/key")
	if cpu := testfix.ProcessCPU() - cpu0; cpu > 0 && cpu0 > 0 {
		b.ReportMetric(float64(cpu)/keys, "cpu-ns/key")
	}
}

// BenchmarkScore: the request path's lookup, 512 keys against a 1M-key inventory.
// Target: <= 50 ns per key looked up, 0 allocs/op.
func BenchmarkScore(b *testing.B) {
	inventory1M(b)
	qs := benchQueries(1 << 20)
	elig := NewMask(benchEndpoints)
	elig.SetAll(benchEndpoints)
	scores := make([]int32, benchEndpoints)
	for _, mode := range []Mode{Overlap, Prefix} {
		name := fmt.Sprintf("%v/keys=%d/endpoints=%d/inventory=1M", mode, benchQueryLen, benchEndpoints)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := testfix.ProcessCPU()
			i := 0
			for b.Loop() {
				bench1M.inv.Score(qs[i%benchQueryCount], elig, mode, scores)
				i++
			}
			reportPerKey(b, looked(mode), cpu0)
			if mode == Prefix && scores[3] != benchQueryHit {
				b.Fatalf("prefix score of endpoint 3 = %d, want %d", scores[3], benchQueryHit)
			}
		})
	}
}

// BenchmarkScoreCached scores one 512-key query again and again against the 1M-key
// inventory, so its home buckets stay in cache: the request path's case of a prompt
// scored while its blocks are hot (bench's BenchmarkDecisionStages/score), where the
// probes find their lines in cache and the prefetch window is pure overhead.
func BenchmarkScoreCached(b *testing.B) {
	inventory1M(b)
	q := benchQueries(1 << 20)[0]
	elig := NewMask(benchEndpoints)
	elig.SetAll(benchEndpoints)
	scores := make([]int32, benchEndpoints)
	for _, mode := range []Mode{Overlap, Prefix} {
		b.Run(fmt.Sprintf("%v/keys=%d/endpoints=%d/inventory=1M", mode, benchQueryLen, benchEndpoints), func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := testfix.ProcessCPU()
			for b.Loop() {
				bench1M.inv.Score(q, elig, mode, scores)
			}
			reportPerKey(b, looked(mode), cpu0)
			if scores[3] != benchQueryHit {
				b.Fatalf("score of endpoint 3 = %d, want %d", scores[3], benchQueryHit)
			}
		})
	}
}

// looked is the number of keys a query looks up: prefix stops at the first key that no
// endpoint still in the run holds.
func looked(mode Mode) int {
	if mode == Prefix {
		return benchQueryHit + 1
	}
	return benchQueryLen
}

// BenchmarkScoreBaseline runs BenchmarkScore's workload on the baselines.
func BenchmarkScoreBaseline(b *testing.B) {
	baselines1M()
	qs := benchQueries(1 << 20)
	scores := make([]int32, benchEndpoints)
	e := lowBits(benchEndpoints)
	for _, mode := range []Mode{Overlap, Prefix} {
		suffix := fmt.Sprintf("%v/keys=%d/endpoints=%d/inventory=1M", mode, benchQueryLen, benchEndpoints)
		b.Run("rwmutex-map/"+suffix, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := testfix.ProcessCPU()
			i := 0
			for b.Loop() {
				bench1M.rw.score(qs[i%benchQueryCount], e, mode, scores)
				i++
			}
			reportPerKey(b, looked(mode), cpu0)
		})
		b.Run("xsync-map/"+suffix, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := testfix.ProcessCPU()
			i := 0
			for b.Loop() {
				scoreXsync(bench1M.xm, qs[i%benchQueryCount], e, mode, scores)
				i++
			}
			reportPerKey(b, looked(mode), cpu0)
		})
	}
}

// BenchmarkInventoryAdd: one writer applying 16-key BlockStored batches.
// grow: into an inventory that starts empty (rebuilds included; reset every 4M keys).
// churn: at a steady 1M keys, each batch added is matched by removing the oldest batch.
// Target: >= 5M keys/s added by one writer. The baselines lock once per batch.
func BenchmarkInventoryAdd(b *testing.B) {
	const batchLen = 16
	const resetAt = 4 << 20
	type impl struct {
		name   string
		reset  func()
		add    func(ep int, batch []uint64)
		remove func(ep int, batch []uint64)
	}
	var inv *Inventory
	var rw *rwMap
	var xm *xsync.MapOf[uint64, uint64]
	impls := []impl{
		{"shard", func() { inv, _ = New(Config{Endpoints: benchEndpoints}) },
			func(ep int, batch []uint64) { inv.Add(ep, batch) },
			func(ep int, batch []uint64) { inv.Remove(ep, batch) }},
		{"rwmutex-map", func() { rw = &rwMap{m: make(map[uint64]uint64)} },
			func(ep int, batch []uint64) {
				rw.mu.Lock()
				for _, k := range batch {
					rw.m[k] |= 1 << ep
				}
				rw.mu.Unlock()
			},
			func(ep int, batch []uint64) {
				rw.mu.Lock()
				for _, k := range batch {
					if m := rw.m[k] &^ (1 << ep); m == 0 {
						delete(rw.m, k)
					} else {
						rw.m[k] = m
					}
				}
				rw.mu.Unlock()
			}},
		{"xsync-map", func() { xm = xsync.NewMapOf[uint64, uint64]() },
			func(ep int, batch []uint64) {
				for _, k := range batch {
					xm.Compute(k, func(old uint64, _ bool) (uint64, bool) {
						return old | 1<<ep, false
					})
				}
			},
			func(ep int, batch []uint64) {
				for _, k := range batch {
					xm.Compute(k, func(old uint64, _ bool) (uint64, bool) {
						if m := old &^ (1 << ep); m != 0 {
							return m, false
						}
						return 0, true
					})
				}
			}},
	}
	batch := make([]uint64, batchLen)
	fill := func(start uint64) []uint64 {
		for i := range batch {
			batch[i] = benchKey(start + uint64(i))
		}
		return batch
	}
	for _, im := range impls {
		b.Run(im.name+"/grow", func(b *testing.B) {
			im.reset()
			next := uint64(0)
			b.ReportAllocs()
			cpu0 := testfix.ProcessCPU()
			for b.Loop() {
				if next >= resetAt {
					b.StopTimer()
					im.reset()
					runtime.GC()
					next = 0
					b.StartTimer()
				}
				im.add(int(next/batchLen%benchEndpoints), fill(next))
				next += batchLen
			}
			reportKeysPerSec(b, batchLen, cpu0)
			im.reset()
		})
		b.Run(im.name+"/churn/inventory=1M", func(b *testing.B) {
			const size = 1 << 20
			im.reset()
			for i := uint64(0); i < size; i += batchLen {
				im.add(int(i/batchLen%benchEndpoints), fill(i))
			}
			oldest, next := uint64(0), uint64(size)
			b.ReportAllocs()
			cpu0 := testfix.ProcessCPU()
			for b.Loop() {
				im.add(int(next/batchLen%benchEndpoints), fill(next))
				next += batchLen
				im.remove(int(oldest/batchLen%benchEndpoints), fill(oldest))
				oldest += batchLen
			}
			reportKeysPerSec(b, batchLen, cpu0)
			im.reset()
		})
	}
}

// reportKeysPerSec reports keys per wall second and per CPU second of the process
// (cpu0 is testfix.ProcessCPU() when the timed loop started; GC work counts against us).
func reportKeysPerSec(b *testing.B, keysPerOp int, cpu0 int64) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N*keysPerOp)/s/1e6, "Mkeys/s")
	}
	if cpu := testfix.ProcessCPU() - cpu0; cpu > 0 && cpu0 > 0 {
		b.ReportMetric(float64(b.N*keysPerOp)/(float64(cpu)/1e9)/1e6, "Mkeys/cpu-s")
	}
}

// BenchmarkInventoryMemory reports bytes per unique key at 1M and 10M keys: the Go heap
// the index holds after a GC (heap-B/key) and, for the inventory, what MemoryBytes
// reports (B/key). Target: <= 24 B/key at 1M keys. Run with -benchtime=1x.
func BenchmarkInventoryMemory(b *testing.B) {
	for _, n := range []uint64{1 << 20, 10 << 20} {
		label := fmt.Sprintf("keys=%dM", n>>20)
		b.Run("shard/"+label, func(b *testing.B) {
			for b.Loop() {
				var inv *Inventory
				heap := heapDelta(func() { inv = fillInventory(b, n) })
				if inv.Len() != int(n) {
					b.Fatalf("Len = %d", inv.Len())
				}
				b.ReportMetric(float64(inv.MemoryBytes())/float64(n), "B/key")
				b.ReportMetric(float64(heap)/float64(n), "heap-B/key")
				runtime.KeepAlive(inv)
			}
		})
		b.Run("rwmutex-map/"+label, func(b *testing.B) {
			for b.Loop() {
				var rw *rwMap
				heap := heapDelta(func() { rw = fillRWMap(n) })
				b.ReportMetric(float64(heap)/float64(n), "heap-B/key")
				runtime.KeepAlive(rw)
			}
		})
		b.Run("xsync-map/"+label, func(b *testing.B) {
			for b.Loop() {
				var xm *xsync.MapOf[uint64, uint64]
				heap := heapDelta(func() { xm = fillXsync(n) })
				b.ReportMetric(float64(heap)/float64(n), "heap-B/key")
				runtime.KeepAlive(xm)
			}
		})
	}
}

// heapDelta is the live heap build leaves behind, measured after full GCs.
func heapDelta(build func()) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// BenchmarkScoreWhileWriting is BenchmarkScore's overlap workload while one writer
// goroutine churns the same index (add a 16-key batch, remove the oldest, then sleep
// 20 us, so every implementation gets about the same write load; writer-Mkeys/s
// reports it): what readers pay for concurrent writes. The RWMutex baseline's readers wait for the writer's lock;
// the inventory's never do. B/op counts the writer goroutine's allocations (table
// rebuilds) too: Score itself allocates nothing (TestScoreAllocatesNothing).
func BenchmarkScoreWhileWriting(b *testing.B) {
	const batchLen = 16
	qs := benchQueries(1 << 20)
	scores := make([]int32, benchEndpoints)
	elig := NewMask(benchEndpoints)
	elig.SetAll(benchEndpoints)
	e := lowBits(benchEndpoints)
	suffix := fmt.Sprintf("overlap/keys=%d/endpoints=%d/inventory=1M", benchQueryLen, benchEndpoints)
	run := func(b *testing.B, write func(add bool, ep int, batch []uint64), score func(q []uint64)) {
		var stop sync.WaitGroup
		var written atomic.Int64
		done := make(chan struct{})
		stop.Add(1)
		go func() {
			defer stop.Done()
			batch := make([]uint64, batchLen)
			for i := uint64(0); ; i += batchLen {
				select {
				case <-done:
					return
				default:
				}
				time.Sleep(20 * time.Microsecond)
				written.Add(batchLen)
				for j := range batch {
					batch[j] = benchKey(1<<40 + i + uint64(j))
				}
				write(true, int(i/batchLen%benchEndpoints), batch)
				if i >= 1<<16 {
					for j := range batch {
						batch[j] = benchKey(1<<40 + i - 1<<16 + uint64(j))
					}
					write(false, int((i-1<<16)/batchLen%benchEndpoints), batch)
				}
			}
		}()
		b.ReportAllocs()
		w0 := written.Load()
		cpu0 := testfix.ProcessCPU() // includes the writer's CPU
		i := 0
		for b.Loop() {
			score(qs[i%benchQueryCount])
			i++
		}
		reportPerKey(b, benchQueryLen, cpu0)
		b.ReportMetric(float64(written.Load()-w0)/b.Elapsed().Seconds()/1e6, "writer-Mkeys/s")
		close(done)
		stop.Wait()
	}
	// Each sub-benchmark gets a fresh 1M-key index: the writer leaves its keys behind.
	b.Run("shard/"+suffix, func(b *testing.B) {
		inv := fillInventory(b, 1<<20)
		run(b, func(add bool, ep int, batch []uint64) {
			if add {
				inv.Add(ep, batch)
			} else {
				inv.Remove(ep, batch)
			}
		}, func(q []uint64) { inv.Score(q, elig, Overlap, scores) })
	})
	b.Run("rwmutex-map/"+suffix, func(b *testing.B) {
		rw := fillRWMap(1 << 20)
		run(b, func(add bool, ep int, batch []uint64) {
			rw.mu.Lock()
			for _, k := range batch {
				if add {
					rw.m[k] |= 1 << ep
				} else if m := rw.m[k] &^ (1 << ep); m == 0 {
					delete(rw.m, k)
				} else {
					rw.m[k] = m
				}
			}
			rw.mu.Unlock()
		}, func(q []uint64) { rw.score(q, e, Overlap, scores) })
	})
	b.Run("xsync-map/"+suffix, func(b *testing.B) {
		xm := fillXsync(1 << 20)
		run(b, func(add bool, ep int, batch []uint64) {
			for _, k := range batch {
				xm.Compute(k, func(old uint64, _ bool) (uint64, bool) {
					if add {
						return old | 1<<ep, false
					}
					if m := old &^ (1 << ep); m != 0 {
						return m, false
					}
					return 0, true
				})
			}
		}, func(q []uint64) { scoreXsync(xm, q, e, Overlap, scores) })
	})
}

// BenchmarkScoreParallel is BenchmarkScore's overlap workload from GOMAXPROCS readers at
// once (b.RunParallel): readers of the inventory share no written cache line, while
// RWMutex readers all update the lock's reader count.
func BenchmarkScoreParallel(b *testing.B) {
	inventory1M(b)
	baselines1M()
	qs := benchQueries(1 << 20)
	elig := NewMask(benchEndpoints)
	elig.SetAll(benchEndpoints)
	e := lowBits(benchEndpoints)
	suffix := fmt.Sprintf("overlap/keys=%d/endpoints=%d/inventory=1M", benchQueryLen, benchEndpoints)
	for _, impl := range []struct {
		name  string
		score func(q []uint64, scores []int32)
	}{
		{"shard", func(q []uint64, scores []int32) { bench1M.inv.Score(q, elig, Overlap, scores) }},
		{"rwmutex-map", func(q []uint64, scores []int32) { bench1M.rw.score(q, e, Overlap, scores) }},
		{"xsync-map", func(q []uint64, scores []int32) { scoreXsync(bench1M.xm, q, e, Overlap, scores) }},
	} {
		b.Run(impl.name+"/"+suffix, func(b *testing.B) {
			b.ReportAllocs()
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				scores := make([]int32, benchEndpoints)
				i := int(next.Add(97))
				for pb.Next() {
					impl.score(qs[i%benchQueryCount], scores)
					i++
				}
			})
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchQueryLen, "ns/key")
		})
	}
}

// BenchmarkLayouts runs the target workloads for each bucket layout (the in-bucket mask
// width follows the rule's endpoint count: 8, 16, 32, 64 bits, and 64 plus out-of-line
// words beyond 64 endpoints), so the figures for endpoints=8 above can be read against
// every other width. Per width: one writer's 16-key adds at a steady 1M keys matched by
// removes (add-churn, keys added per second), bytes per key after adding 1M keys
// (memory), and a 512-key overlap Score against that inventory (score; 3/4 of the keys
// held). Key i is held by endpoint i % endpoints.
func BenchmarkLayouts(b *testing.B) {
	const n, batchLen = 1 << 20, 16
	for _, eps := range []int{8, 16, 32, 64, 128} {
		key := func(i uint64) uint64 { return benchKey(i ^ uint64(eps)<<56) }
		fill := func(b *testing.B) *Inventory {
			inv, err := New(Config{Endpoints: eps})
			if err != nil {
				b.Fatal(err)
			}
			batch := make([]uint64, 0, batchLen)
			for i := uint64(0); i < n; i += batchLen {
				batch = batch[:0]
				for j := i; j < i+batchLen; j++ {
					batch = append(batch, key(j))
				}
				inv.Add(int(i/batchLen)%eps, batch)
			}
			return inv
		}
		var inv *Inventory
		b.Run(fmt.Sprintf("endpoints=%d/memory", eps), func(b *testing.B) {
			for b.Loop() {
				inv = fill(b)
			}
			if inv.Len() != n {
				b.Fatalf("Len = %d", inv.Len())
			}
			b.ReportMetric(float64(inv.MemoryBytes())/n, "B/key")
		})
		if inv == nil {
			continue // filtered out: the others need the inventory
		}
		b.Run(fmt.Sprintf("endpoints=%d/score", eps), func(b *testing.B) {
			// Distinct queries, rotated, as in BenchmarkScore: not one cache-resident chain.
			qs := make([][]uint64, benchQueryCount)
			for v := range qs {
				q := make([]uint64, 0, benchQueryLen)
				for i := uint64(v) * 4099; len(q) < benchQueryHit; i += 2039 * batchLen {
					q = append(q, key(i%n))
				}
				for i := uint64(0); len(q) < benchQueryLen; i++ {
					q = append(q, key(n+uint64(v)*benchQueryLen+i))
				}
				qs[v] = q
			}
			elig := NewMask(eps)
			elig.SetAll(eps)
			scores := make([]int32, eps)
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
			if sum != benchQueryHit {
				b.Fatalf("overlap sum %d, want %d", sum, benchQueryHit)
			}
		})
		b.Run(fmt.Sprintf("endpoints=%d/add-churn", eps), func(b *testing.B) {
			batch := make([]uint64, batchLen)
			fillBatch := func(start uint64) []uint64 {
				for i := range batch {
					batch[i] = key(start + uint64(i))
				}
				return batch
			}
			oldest, next := uint64(0), uint64(n)
			b.ReportAllocs()
			cpu0 := testfix.ProcessCPU()
			for b.Loop() {
				inv.Add(int(next/batchLen)%eps, fillBatch(next))
				next += batchLen
				inv.Remove(int(oldest/batchLen)%eps, fillBatch(oldest))
				oldest += batchLen
			}
			reportKeysPerSec(b, batchLen, cpu0)
		})
		inv = nil
	}
}
