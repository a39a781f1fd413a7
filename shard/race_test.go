package shard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentWritersAndReaders runs, for each bucket layout, 8 writers (add / remove / clear) and 4 readers
// against one inventory and checks, while they run:
//   - every writer owns one endpoint, so its own model of that endpoint is exact: after
//     each step Count and a Score of the keys it touched must match it (a lost update or
//     a torn mask word would show here);
//   - a pinned endpoint whose keys nobody touches keeps all of them through every
//     rebuild, clear and eviction of others: readers must score it exactly;
//   - writer-private keys never show bits of another writer (a reader that took the
//     mask of a key that recycled a tombstone's slot would show one here);
//   - every Score is self-consistent (bounds, ranking).
//
// and, once they stop, that every endpoint's listing equals its writer's model.
// Run with -race.
func TestConcurrentWritersAndReaders(t *testing.T) {
	// One rule per bucket layout: 1-, 2-, 4- and 8-byte in-bucket masks, and sparse sets
	// (shared keys held by the pinned endpoint and up to 8 writers spill and unspill).
	for _, endpoints := range []int{8, 10, 20, 64, 130, 1024} {
		t.Run(fmt.Sprintf("endpoints=%d", endpoints), func(t *testing.T) {
			runConcurrent(t, endpoints, compactMinSlots)
		})
	}
	// Every table compacted in the background (compact.go) under the same load.
	for _, endpoints := range []int{10, 1024} {
		t.Run(fmt.Sprintf("endpoints=%d/compact-min=0", endpoints), func(t *testing.T) {
			runConcurrent(t, endpoints, 0)
		})
	}
}

const (
	raceWriters = 8
	raceReaders = 4
)

func runConcurrent(t *testing.T, endpoints, compactMin int) {
	inv, err := New(Config{Endpoints: endpoints, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	inv.compactMinSlots = compactMin
	// Writer w writes endpoint w; the last endpoint is pinned, so a rule of 8 endpoints
	// (the 1-byte mask layout) gets 7 writers.
	writers := min(raceWriters, endpoints-1)
	pinnedEP := endpoints - 1
	r := rand.New(rand.NewPCG(11, uint64(endpoints)))
	shared := make([]uint64, 6000) // keys every writer adds and removes
	for i := range shared {
		shared[i] = r.Uint64()
	}
	pinned := append([]uint64{0}, shared[:500]...) // shared with writers, plus key 0
	if inv.Add(pinnedEP, pinned) != len(pinned) {
		t.Fatal("pinned add")
	}
	// private(w, i) keys belong to writer w alone: the top byte names the writer.
	private := func(w, i int) uint64 { return uint64(w+1)<<56 | uint64(i)<<8 | 0x5a }

	var (
		stop     atomic.Bool
		failed   atomic.Bool
		wg       sync.WaitGroup
		models   = make([]map[uint64]bool, writers)
		failOnce sync.Once
	)
	fail := func(format string, args ...any) {
		failOnce.Do(func() { t.Errorf(format, args...) })
		failed.Store(true)
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			mine := map[uint64]bool{}
			models[w] = mine
			scores := make([]int32, endpoints)
			elig := NewMask(endpoints)
			elig.Set(w)
			batch := make([]uint64, 0, 64)
			for step := 0; !failed.Load() && (step < 200 || time.Now().Before(deadline)); step++ {
				batch = batch[:0]
				for i := 0; i < 1+r.IntN(48); i++ {
					if r.IntN(4) == 0 {
						batch = append(batch, private(w, r.IntN(3000)))
					} else {
						batch = append(batch, shared[r.IntN(len(shared))])
					}
				}
				switch x := r.IntN(100); {
				case x < 55:
					want := 0
					for _, k := range batch {
						if !mine[k] {
							mine[k] = true
							want++
						}
					}
					if got := inv.Add(w, batch); got != want {
						fail("writer %d: Add = %d, want %d", w, got, want)
					}
				case x < 99:
					// Mostly keys this writer holds, so removes really clear bits.
					for k := range mine {
						if len(batch) == cap(batch) || r.IntN(8) == 0 {
							break
						}
						batch = append(batch, k)
					}
					want := 0
					for _, k := range batch {
						if mine[k] {
							delete(mine, k)
							want++
						}
					}
					if got := inv.Remove(w, batch); got != want {
						fail("writer %d: Remove = %d, want %d", w, got, want)
					}
				default:
					inv.ClearEndpoint(w)
					clear(mine)
				}
				if got := inv.Count(w); got != len(mine) {
					fail("writer %d: Count = %d, model %d", w, got, len(mine))
				}
				held := 0
				for _, k := range batch {
					if mine[k] {
						held++
					}
				}
				if inv.Score(batch, elig, Overlap, scores); int(scores[w]) != held {
					fail("writer %d: overlap %d, model %d", w, scores[w], held)
				}
			}
		}(w)
	}
	var reads atomic.Int64
	for rd := 0; rd < raceReaders; rd++ {
		wg.Add(1)
		go func(rd int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(rd), 7))
			scores := make([]int32, endpoints)
			all := NewMask(endpoints)
			all.SetAll(endpoints)
			for !stop.Load() && !failed.Load() {
				// A chain: a pinned run, then a mix of pinned and other keys.
				run := 1 + r.IntN(64)
				chain := make([]uint64, 0, run+64)
				for i := 0; i < run; i++ {
					chain = append(chain, pinned[r.IntN(len(pinned))])
				}
				held := run
				for i := 0; i < r.IntN(64); i++ {
					switch r.IntN(3) {
					case 0:
						chain = append(chain, pinned[r.IntN(len(pinned))])
						held++
					case 1:
						chain = append(chain, private(r.IntN(writers), r.IntN(3000)))
					default:
						chain = append(chain, shared[500+r.IntN(len(shared)-500)])
					}
				}
				for _, mode := range []Mode{Overlap, Prefix} {
					best, second := inv.Score(chain, all, mode, scores)
					want := held
					if mode == Prefix {
						want = run
						for want < len(chain) && slices.Contains(pinned, chain[want]) {
							want++
						}
					}
					if int(scores[pinnedEP]) != want {
						fail("reader %d: %v score of pinned endpoint %d, want %d", rd, mode, scores[pinnedEP], want)
					}
					checkRanking(fail, scores, best, second, len(chain))
				}
				// Private keys of one writer carry no other writer's bit.
				w := r.IntN(writers)
				priv := make([]uint64, 32)
				for i := range priv {
					priv[i] = private(w, r.IntN(3000))
				}
				inv.Score(priv, all, Overlap, scores)
				for ep, s := range scores {
					if ep != w && s != 0 {
						fail("reader %d: endpoint %d scores %d on writer %d's private keys", rd, ep, s, w)
					}
				}
				if c := inv.Count(pinnedEP); c != len(pinned) {
					fail("reader %d: pinned Count = %d, want %d", rd, c, len(pinned))
				}
				if n := inv.Len(); n < len(pinned) {
					fail("reader %d: Len %d below the pinned keys", rd, n)
				}
				reads.Add(1)
			}
		}(rd)
	}
	// Readers run until the writers are done.
	waitWriters := make(chan struct{})
	go func() {
		for !failed.Load() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		close(waitWriters)
	}()
	<-waitWriters
	// Writers stop at the deadline by themselves; readers need the flag.
	time.Sleep(50 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}
	if reads.Load() == 0 {
		t.Fatal("readers never ran")
	}
	for w, mine := range models {
		want := make([]uint64, 0, len(mine))
		for k := range mine {
			want = append(want, k)
		}
		slices.Sort(want)
		if got := listAll(t, inv, w, 500); !slices.Equal(got, want) {
			t.Fatalf("writer %d: listing has %d keys, model %d", w, len(got), len(want))
		}
	}
	if got := listAll(t, inv, pinnedEP, 0); len(got) != len(pinned) {
		t.Fatalf("pinned listing has %d keys, want %d", len(got), len(pinned))
	}
	st := inv.Stats()
	if st.Rebuilds == 0 || st.EndpointClears == 0 {
		t.Errorf("workload did not exercise rebuilds and clears: %+v", st)
	}
	t.Logf("%d reader rounds; stats %+v", reads.Load(), st)
}

func checkRanking(fail func(string, ...any), scores []int32, best, second, keys int) {
	for ep, s := range scores {
		if s < 0 || int(s) > keys {
			fail("score %d of endpoint %d outside [0, %d]", s, ep, keys)
		}
	}
	if best < 0 || second < 0 || best == second {
		fail("best %d second %d with every endpoint eligible", best, second)
		return
	}
	for ep, s := range scores {
		if s > scores[best] || (s == scores[best] && ep < best) {
			fail("best %d (score %d) but endpoint %d has %d", best, scores[best], ep, s)
		}
		if ep != best && (s > scores[second] || (s == scores[second] && ep < second)) {
			fail("second %d (score %d) but endpoint %d has %d", second, scores[second], ep, s)
		}
	}
}

// TestConcurrentClearAll: ClearAll racing writers and readers leaves no negative counts,
// no out-of-range scores, every count equal to the keys held once writers stop, and an
// empty inventory once it runs last.
func TestConcurrentClearAll(t *testing.T) {
	inv, _ := New(Config{Endpoints: 8, Shards: 2})
	var wg sync.WaitGroup
	var stop atomic.Bool
	var bad atomic.Value
	for w := 0; w < raceWriters; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 5))
			keys := make([]uint64, 32)
			for !stop.Load() {
				for i := range keys {
					keys[i] = r.Uint64N(4000)
				}
				if r.IntN(2) == 0 {
					inv.Add(w, keys)
				} else {
					inv.Remove(w, keys)
				}
				if c := inv.Count(w); c < 0 {
					bad.Store(fmt.Sprintf("Count(%d) = %d", w, c))
				}
			}
		}(w)
	}
	for rd := 0; rd < raceReaders; rd++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := make([]uint64, 100)
			for i := range keys {
				keys[i] = uint64(i)
			}
			scores := make([]int32, 8)
			all := NewMask(8)
			all.SetAll(8)
			for !stop.Load() {
				inv.Score(keys, all, Prefix, scores)
				for _, s := range scores {
					if s < 0 || s > 100 {
						bad.Store(fmt.Sprintf("score %d", s))
					}
				}
			}
		}()
	}
	for i := 0; i < 50; i++ {
		time.Sleep(2 * time.Millisecond)
		inv.ClearAll()
	}
	stop.Store(true)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	// Writers count their changes once per chunk (epCount): a change made before a
	// ClearAll and counted after it would leave a count off by it.
	for ep := 0; ep < raceWriters; ep++ {
		if c, held := inv.Count(ep), len(listAll(t, inv, ep, 0)); c != held {
			t.Fatalf("endpoint %d: Count %d, but it holds %d keys", ep, c, held)
		}
	}
	inv.ClearAll()
	if inv.Len() != 0 {
		t.Fatalf("Len after ClearAll = %d", inv.Len())
	}
	for ep := 0; ep < 8; ep++ {
		if inv.Count(ep) != 0 || len(listAll(t, inv, ep, 0)) != 0 {
			t.Fatalf("endpoint %d not empty after ClearAll", ep)
		}
	}
}

// TestClearEndpointUnderRebuilds: a writer growing the same shard (so its table is
// rebuilt under the chunked sweep) does not make ClearEndpoint miss keys or hang.
func TestClearEndpointUnderRebuilds(t *testing.T) {
	inv, _ := New(Config{Endpoints: 2, Shards: 1})
	old := make([]uint64, 40_000)
	for i := range old {
		old[i] = benchKey(uint64(i))
	}
	inv.Add(0, old)
	inv.Add(1, old[:20_000])
	done := make(chan struct{})
	go func() {
		defer close(done)
		batch := make([]uint64, 64)
		for i := uint64(0); i < 120_000; i += 64 {
			for j := range batch {
				batch[j] = benchKey(1<<40 + i + uint64(j))
			}
			inv.Add(1, batch)
		}
	}()
	for i := 0; i < 5; i++ {
		inv.ClearEndpoint(0)
		inv.Add(0, old[:1000])
	}
	inv.ClearEndpoint(0)
	<-done
	if c := inv.Count(0); c != 0 {
		t.Fatalf("Count(0) = %d after ClearEndpoint", c)
	}
	if keys := listAll(t, inv, 0, 0); len(keys) != 0 {
		t.Fatalf("endpoint 0 still holds %d keys", len(keys))
	}
	if c := inv.Count(1); c != 20_000+120_000 || len(listAll(t, inv, 1, 0)) != c {
		t.Fatalf("endpoint 1: Count %d", c)
	}
}

// TestClearEndpointRestartsAfterRebuild forces rebuilds between ClearEndpoint's chunks
// (growing the shard from the chunk hook) and checks that the sweep restarts on the new
// table, and that after repeated restarts it still finishes and clears everything.
func TestClearEndpointRestartsAfterRebuild(t *testing.T) {
	for _, rebuildsPerClear := range []int{1, 10} {
		inv, _ := New(Config{Endpoints: 2, Shards: 1})
		old := make([]uint64, 3*clearChunkSlots)
		for i := range old {
			old[i] = benchKey(uint64(i))
		}
		inv.Add(0, old)
		next, hooks := uint64(1<<40), 0
		clearChunkHook = func() {
			if hooks++; hooks > rebuildsPerClear {
				return
			}
			before := inv.Stats().Rebuilds
			for inv.Stats().Rebuilds == before {
				inv.Add(1, []uint64{benchKey(next)})
				next++
			}
		}
		inv.ClearEndpoint(0)
		clearChunkHook = nil
		if hooks == 0 {
			t.Fatal("hook never ran: the sweep took one chunk")
		}
		if c, keys := inv.Count(0), listAll(t, inv, 0, 0); c != 0 || len(keys) != 0 {
			t.Fatalf("%d rebuilds under the sweep: Count(0) = %d, %d keys left", rebuildsPerClear, c, len(keys))
		}
		if c := inv.Count(1); c != int(next-1<<40) || len(listAll(t, inv, 1, 0)) != c {
			t.Fatalf("endpoint 1: Count %d, added %d", c, next-1<<40)
		}
	}
}
