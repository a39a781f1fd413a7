package shard

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSparseSpillAndUnspill walks one key of a 1,024-endpoint rule through every set
// shape: inline (1..4 ids, including the highest id), a list (5..8), a bitmask (9..),
// then down again: a list from relistAt, inline from unspillAt. It checks Score, Count
// and the set word's form at each step, that a freed block is handed out again with a
// new generation, and that key 0 (kept as a plain bitmask) scores the same way.
func TestSparseSpillAndUnspill(t *testing.T) {
	const n = MaxEndpoints
	inv, err := New(Config{Endpoints: n, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	all := NewMask(n)
	all.SetAll(n)
	scores := make([]int32, n)
	for _, key := range []uint64{0x1234_5678_9abc_def1, 0} {
		holders := []int{n - 1, 0, 700, 64, 65, 5, 999, 300, 512, 128}
		setWord := func() uint64 {
			tb := inv.tabs[0].Load()
			if key == 0 {
				return 0
			}
			slot, ok := tb.find(key, tb.home(mix(key), inv.shardBits))
			if !ok {
				t.Fatalf("key %x not found", key)
			}
			return atomic.LoadUint64(tb.setWordAt(slot))
		}
		// form is the set word's form check expects: 0 inline, 1 a list, 2 a bitmask.
		form := 0
		check := func(held []int) {
			t.Helper()
			inv.Score([]uint64{key}, all, Overlap, scores)
			for ep, s := range scores {
				if want := slices.Contains(held, ep); (s == 1) != want || s > 1 {
					t.Fatalf("key %x, holders %v: endpoint %d scores %d", key, held, ep, s)
				}
			}
			inv.Score([]uint64{key, key}, all, Prefix, scores)
			for _, ep := range held {
				if scores[ep] != 2 {
					t.Fatalf("key %x, holders %v: prefix of %d = %d", key, held, ep, scores[ep])
				}
			}
			if key != 0 && len(held) > 0 {
				w := setWord()
				got := 0
				if isSpill(w) {
					got = 2
					if isList(w) {
						got = 1
					}
				}
				if got != form {
					t.Fatalf("holders %v: set word %016x, form %d, want %d", held, w, got, form)
				}
			}
		}
		for i, ep := range holders {
			if inv.Add(ep, []uint64{key}) != 1 || inv.Add(ep, []uint64{key}) != 0 {
				t.Fatalf("add %d: not exactly once", ep)
			}
			form = 0
			if i+1 > listIDs {
				form = 2
			} else if i+1 > sparseIDs {
				form = 1
			}
			check(holders[:i+1])
		}
		if key != 0 && inv.Stats().Spilled != 1 {
			t.Fatalf("Spilled = %d with %d holders", inv.Stats().Spilled, len(holders))
		}
		for len(holders) > 0 {
			ep := holders[len(holders)/2]
			holders = slices.Delete(holders, len(holders)/2, len(holders)/2+1)
			if inv.Remove(ep, []uint64{key}) != 1 || inv.Count(ep) != 0 {
				t.Fatalf("remove %d", ep)
			}
			if len(holders) <= unspillAt {
				form = 0
			} else if len(holders) <= relistAt {
				form = 1
			}
			check(holders)
		}
		if inv.Len() != 0 || inv.Stats().Spilled != 0 {
			t.Fatalf("after removing every holder: Len %d, Spilled %d", inv.Len(), inv.Stats().Spilled)
		}
		if key != 0 {
			// Spill again: the last freed list block comes back with the next generation.
			tb := inv.tabs[0].Load()
			idx := tb.lists.free[len(tb.lists.free)-1]
			gen := tb.lists.gens[idx]
			for ep := 0; ep <= sparseIDs; ep++ {
				inv.Add(ep, []uint64{key})
			}
			if w := setWord(); !isList(w) || uint16(w>>32) != gen+1 || uint32(w)&^listBit != idx {
				t.Fatalf("respilled set word %016x, want list block %d generation %d", w, idx, gen+1)
			}
			if tb.spill.n != 1 {
				t.Fatalf("%d bitmask blocks handed out for one key, want 1", tb.spill.n)
			}
			inv.ClearAll()
		}
	}
}

// TestSparseArenaChunks hands out blocks across several chunks and checks that every
// index maps to its own words (no two blocks overlap) and that chunks double.
func TestSparseArenaChunks(t *testing.T) {
	var a spillArena
	const bw = 3
	seen := map[*uint64]uint32{}
	for i := 0; i < 16+32+64+5; i++ {
		idx, w := a.alloc(bw)
		if uint32(w) != idx || !isSpill(w) || int(idx) != i {
			t.Fatalf("alloc %d: idx %d word %016x", i, idx, w)
		}
		blk := a.block(idx, bw)
		for j := range blk {
			if prev, dup := seen[&blk[j]]; dup {
				t.Fatalf("blocks %d and %d share a word", prev, idx)
			}
			seen[&blk[j]] = idx
		}
	}
	for c, want := range []int{16, 32, 64, 128} {
		if got := len(a.chunks[c].Load().w) / bw; got != want {
			t.Errorf("chunk %d holds %d blocks, want %d", c, got, want)
		}
	}
	if a.chunks[4].Load() != nil {
		t.Error("a fifth chunk before it was needed")
	}
}

// TestSparseFlapUnderReaders: one key's set moves between inline, list and bitmask as
// fast as a writer can toggle endpoints on it, and another key keeps being given the same
// freed blocks, while readers score both. The endpoints that never leave must be seen on every
// read, and no endpoint that never held the key may ever appear (a reader that took a
// block after it changed hands would show one). Run with -race.
func TestSparseFlapUnderReaders(t *testing.T) {
	const n = 1024
	inv, err := New(Config{Endpoints: n, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	const flapKey, otherKey = 0xabc0_0000_0000_0001, 0xdef0_0000_0000_0002
	pinned := []int{10, 600, 1023}                  // always hold flapKey
	flappers := []int{20, 21, 22, 900, 901, 64, 65} // come and go on flapKey
	others := []int{500, 501, 502, 503, 504, 505}
	for _, ep := range pinned {
		inv.Add(ep, []uint64{flapKey})
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var failure atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			for _, ep := range flappers[:1+i%len(flappers)] {
				inv.Add(ep, []uint64{flapKey})
			}
			for _, ep := range others[:1+i%len(others)] {
				inv.Add(ep, []uint64{otherKey})
			}
			for _, ep := range flappers {
				inv.Remove(ep, []uint64{flapKey})
			}
			for _, ep := range others {
				inv.Remove(ep, []uint64{otherKey})
			}
		}
	}()
	var reads atomic.Int64
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			all := NewMask(n)
			all.SetAll(n)
			scores := make([]int32, n)
			for !stop.Load() {
				for _, mode := range []Mode{Overlap, Prefix} {
					inv.Score([]uint64{flapKey}, all, mode, scores)
					for ep, s := range scores {
						want := slices.Contains(pinned, ep)
						if (want && s != 1) || (s != 0 && !want && !slices.Contains(flappers, ep)) {
							failure.Store(fmt.Sprintf("%v: endpoint %d scores %d on the flapping key", mode, ep, s))
						}
					}
				}
				inv.Score([]uint64{otherKey}, all, Overlap, scores)
				for ep, s := range scores {
					if s != 0 && !slices.Contains(others, ep) {
						failure.Store(fmt.Sprintf("endpoint %d scores %d on the other key", ep, s))
					}
				}
				reads.Add(1)
			}
		}()
	}
	time.Sleep(700 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if f := failure.Load(); f != nil {
		t.Fatal(f)
	}
	if reads.Load() == 0 {
		t.Fatal("readers never ran")
	}
	if tb := inv.tabs[0].Load(); tb.lists.n < 2 || tb.spill.n < 1 {
		t.Fatalf("the writer spilled only %d list and %d bitmask blocks", tb.lists.n, tb.spill.n)
	}
}

// TestSparseLookupAllocatesNothing: Score over a 1,024-endpoint rule with inline and
// spilled sets allocates nothing, in both modes.
func TestSparseLookupAllocatesNothing(t *testing.T) {
	inv, err := New(Config{Endpoints: 1024})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]uint64, 512)
	for i := range keys {
		keys[i] = benchKey(uint64(i))
		for h := 0; h < 1+i%7; h++ {
			inv.Add((i*37+h*101)%1024, keys[i:i+1])
		}
	}
	if inv.Stats().Spilled == 0 {
		t.Fatal("no spilled sets")
	}
	all := NewMask(1024)
	all.SetAll(1024)
	scores := make([]int32, 1024)
	for _, mode := range []Mode{Overlap, Prefix} {
		if a := testing.AllocsPerRun(50, func() { inv.Score(keys, all, mode, scores) }); a != 0 {
			t.Errorf("%v: %.1f allocs per Score", mode, a)
		}
	}
}

// TestFleetRulesDefaultToManyShards: a rule of more than 64 endpoints gets fleetShards
// shards unless Config.Shards says otherwise; narrower rules keep the GOMAXPROCS sizing.
func TestFleetRulesDefaultToManyShards(t *testing.T) {
	for _, tc := range []struct{ endpoints, shards, want int }{
		{1024, 0, fleetShards},
		{65, 0, fleetShards},
		{1024, 4, 4},
	} {
		inv, err := New(Config{Endpoints: tc.endpoints, Shards: tc.shards})
		if err != nil {
			t.Fatal(err)
		}
		if inv.Shards() != tc.want {
			t.Errorf("%d endpoints, Shards %d: %d shards, want %d", tc.endpoints, tc.shards, inv.Shards(), tc.want)
		}
	}
	want := 8
	for want < 4*runtime.GOMAXPROCS(0) && want < 256 {
		want *= 2
	}
	if narrow, _ := New(Config{Endpoints: 64}); narrow.Shards() != want {
		t.Errorf("64 endpoints: %d shards, want %d (4 per P)", narrow.Shards(), want)
	}
}

// TestSparseOverlapDeferredSpills: overlap scores of a query whose spilled sets (held by
// more than four endpoints) are scored after the probes behind them, many queue
// flushes' worth, plus key 0 (its mask lives out of the table) and absent keys, equal
// the count made by hand.
func TestSparseOverlapDeferredSpills(t *testing.T) {
	inv, err := New(Config{Endpoints: 1024})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int32, 1024)
	keys := make([]uint64, 0, 600)
	keys = append(keys, 0)
	for i := 1; i < 512; i++ {
		keys = append(keys, benchKey(uint64(i)))
	}
	for i, k := range keys {
		for h := 0; h < 1+i%7; h++ { // 1..7 holders: 3 in 7 keys spill
			ep := (i*37 + h*101) % 1024
			inv.Add(ep, []uint64{k})
			want[ep]++
		}
	}
	for i := 0; i < 64; i++ {
		keys = append(keys, benchKey(uint64(1<<40+i))) // absent
	}
	if inv.Stats().Spilled < 100 {
		t.Fatalf("%d spilled sets, want well over spillBatch", inv.Stats().Spilled)
	}
	all := NewMask(1024)
	all.SetAll(1024)
	scores := make([]int32, 1024)
	inv.Score(keys, all, Overlap, scores)
	for ep := range want {
		if scores[ep] != want[ep] {
			t.Fatalf("endpoint %d scored %d, want %d", ep, scores[ep], want[ep])
		}
	}
	// Ineligible endpoints score nothing, spilled or inline.
	half := NewMask(1024)
	for ep := 0; ep < 1024; ep += 2 {
		half.Set(ep)
	}
	inv.Score(keys, half, Overlap, scores)
	for ep := range want {
		if w := want[ep] * int32(1-ep%2); scores[ep] != w {
			t.Fatalf("half eligible: endpoint %d scored %d, want %d", ep, scores[ep], w)
		}
	}
}

// BenchmarkPrefixSparse scores a shared 512-key prefix (8,192 tokens at block 16) by its
// longest leading run over a 1,024-endpoint rule, every key held by the same engines:
// three (inline sets) or six (id lists, spilled). Each key's set is decoded into the
// run (prefixSparse), so this times that decode on the path a hot prefix takes.
func BenchmarkPrefixSparse(b *testing.B) {
	for _, holders := range []int{3, 6} {
		b.Run(fmt.Sprintf("holders=%d", holders), func(b *testing.B) {
			inv, err := New(Config{Endpoints: MaxEndpoints})
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]uint64, 512)
			for i := range keys {
				keys[i] = benchKey(uint64(i) + 1)
			}
			for h := 0; h < holders; h++ {
				inv.Add(h*171+5, keys)
			}
			elig := NewMask(MaxEndpoints)
			elig.SetAll(MaxEndpoints)
			scores := make([]int32, MaxEndpoints)
			b.ReportAllocs()
			for b.Loop() {
				inv.Score(keys, elig, Prefix, scores)
			}
			if scores[5] != int32(len(keys)) {
				b.Fatalf("prefix score %d, want %d", scores[5], len(keys))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(keys)), "ns/key")
		})
	}
}
