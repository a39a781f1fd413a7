package shard

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Endpoints: 0},
		{Endpoints: -1},
		{Endpoints: MaxEndpoints + 1},
		{Endpoints: 8, Shards: 3},
		{Endpoints: 8, Shards: -4},
		{Endpoints: 8, Shards: MaxShards * 2},
		{Endpoints: 8, MaxKeysPerEndpoint: -1},
	} {
		if inv, err := New(cfg); err == nil || inv != nil {
			t.Errorf("New(%+v) = %v, %v; want an error", cfg, inv, err)
		}
	}
	inv, err := New(Config{Endpoints: 8})
	if err != nil {
		t.Fatal(err)
	}
	if s := inv.Shards(); s < 8 || s&(s-1) != 0 {
		t.Errorf("auto shards = %d, want a power of two >= 8", s)
	}
	if inv.MaxKeysPerEndpoint() != DefaultMaxKeysPerEndpoint {
		t.Errorf("default bound = %d", inv.MaxKeysPerEndpoint())
	}
}

func TestMask(t *testing.T) {
	m := NewMask(130)
	if len(m) != 3 {
		t.Fatalf("NewMask(130) has %d words", len(m))
	}
	for _, i := range []int{0, 63, 64, 129} {
		m.Set(i)
		if !m.Has(i) {
			t.Errorf("Has(%d) after Set = false", i)
		}
	}
	m.Set(-1)
	m.Set(192) // out of range: ignored, no panic
	if m.Count() != 4 || m.Has(192) || m.Has(-1) {
		t.Errorf("out-of-range Set changed the mask: %x", m)
	}
	m.Clear(63)
	if m.Has(63) || m.Count() != 3 {
		t.Errorf("Clear(63) failed: %x", m)
	}
	m.SetAll(70)
	if m.Count() != 70 || !m.Has(69) || m.Has(70) || m[2] != 0 {
		t.Errorf("SetAll(70) = %x", m)
	}
	m.SetAll(0)
	if m.Count() != 0 {
		t.Errorf("SetAll(0) = %x", m)
	}
	if md, ok := ParseMode("prefix"); !ok || md != Prefix || md.String() != "prefix" {
		t.Errorf("ParseMode(prefix) = %v, %v", md, ok)
	}
	if _, ok := ParseMode("best"); ok {
		t.Error("ParseMode accepted an unknown mode")
	}
}

// TestScoreByHand pins the two modes and the ranking on a case worked out on paper.
func TestScoreByHand(t *testing.T) {
	inv, err := New(Config{Endpoints: 4, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	chain := []uint64{11, 12, 13, 14, 15}
	inv.Add(0, []uint64{11, 12, 14, 15}) // overlap 4, prefix 2
	inv.Add(1, []uint64{11, 12, 13})     // overlap 3, prefix 3
	inv.Add(2, []uint64{15})             // overlap 1, prefix 0
	inv.Add(3, chain)                    // holds all, but ineligible below
	elig := NewMask(4)
	elig.SetAll(3)
	scores := make([]int32, 4)

	best, second := inv.Score(chain, elig, Overlap, scores)
	if want := []int32{4, 3, 1, 0}; !slices.Equal(scores, want) || best != 0 || second != 1 {
		t.Errorf("overlap: %v best %d second %d; want %v best 0 second 1", scores, best, second, want)
	}
	best, second = inv.Score(chain, elig, Prefix, scores)
	if want := []int32{2, 3, 0, 0}; !slices.Equal(scores, want) || best != 1 || second != 0 {
		t.Errorf("prefix: %v best %d second %d; want %v best 1 second 0", scores, best, second, want)
	}
	// Ties go to the lowest index.
	inv.Add(2, []uint64{11, 12, 14})
	best, second = inv.Score(chain, elig, Overlap, scores)
	if best != 0 || second != 2 {
		t.Errorf("tie: best %d second %d; want 0, 2 (scores %v)", best, second, scores)
	}
	// Nothing eligible, no keys, short scores.
	if b, s := inv.Score(chain, NewMask(4), Overlap, scores); b != -1 || s != -1 {
		t.Errorf("empty eligible: %d %d", b, s)
	}
	if b, s := inv.Score(nil, elig, Prefix, scores); b != 0 || s != 1 || scores[0] != 0 {
		t.Errorf("no keys: %d %d %v", b, s, scores)
	}
	one := NewMask(4)
	one.Set(1)
	if b, s := inv.Score(chain, one, Overlap, scores); b != 1 || s != -1 {
		t.Errorf("one eligible: %d %d", b, s)
	}
	if b, s := inv.Score(chain, elig, Overlap, scores[:1]); b != 0 || s != -1 {
		t.Errorf("one score slot: %d %d", b, s)
	}
	if b, s := inv.Score(chain, nil, Overlap, scores); b != -1 || s != -1 {
		t.Errorf("nil eligible: %d %d", b, s)
	}
}

func TestBadEndpointIsCountedNotPanicked(t *testing.T) {
	inv, _ := New(Config{Endpoints: 8})
	if inv.Add(8, []uint64{1}) != 0 || inv.Add(-1, []uint64{1}) != 0 || inv.Remove(99, []uint64{1}) != 0 {
		t.Error("out-of-range endpoint changed the inventory")
	}
	inv.ClearEndpoint(8)
	if inv.Count(8) != 0 || inv.Count(-1) != 0 || inv.Len() != 0 {
		t.Error("out-of-range endpoint visible")
	}
	if keys, next := inv.Keys(8, 0, 10, nil); len(keys) != 0 || next != 0 {
		t.Error("Keys of out-of-range endpoint")
	}
	if st := inv.Stats(); st.BadEndpoint != 4 {
		t.Errorf("BadEndpoint = %d, want 4", st.BadEndpoint)
	}
}

// TestBoundEvictsOlderKeys: at the per-endpoint bound a new key evicts one of the same
// endpoint's keys; the count never passes the bound and the newest key is always held.
func TestBoundEvictsOlderKeys(t *testing.T) {
	const bound = 100
	inv, err := New(Config{Endpoints: 4, Shards: 1, MaxKeysPerEndpoint: bound})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	inv.Add(1, []uint64{7, 8, 9}) // another endpoint's keys are never victims
	added := map[uint64]bool{}
	for i := 0; i < 1000; i++ {
		k := r.Uint64()
		if inv.Add(0, []uint64{k}) != 1 {
			t.Fatalf("add %d: key not added although a victim exists", i)
		}
		added[k] = true
		if c := inv.Count(0); c > bound {
			t.Fatalf("Count = %d > bound %d", c, bound)
		}
		if b, _ := inv.Score([]uint64{k}, Mask{1}, Overlap, make([]int32, 4)); b != 0 {
			t.Fatalf("newest key not held")
		}
	}
	held := listAll(t, inv, 0, 0)
	if len(held) != bound || inv.Count(0) != bound {
		t.Fatalf("held %d keys (Count %d), want %d", len(held), inv.Count(0), bound)
	}
	for _, k := range held {
		if !added[k] {
			t.Fatalf("held key %d was never added", k)
		}
	}
	if inv.Count(1) != 3 {
		t.Fatalf("endpoint 1 lost keys to endpoint 0's bound: %d", inv.Count(1))
	}
	st := inv.Stats()
	if st.EvictedAtBound != 1000-bound || st.DroppedAtBound != 0 || st.Added != 1003 {
		t.Fatalf("stats %+v; want %d evicted, 0 dropped, 1003 added", st, 1000-bound)
	}
}

// TestBoundDropsWithoutVictim: with many shards and a tiny bound, the new key's shard
// usually holds none of the endpoint's keys: the key is dropped and counted.
func TestBoundDropsWithoutVictim(t *testing.T) {
	inv, _ := New(Config{Endpoints: 2, Shards: 64, MaxKeysPerEndpoint: 2})
	r := rand.New(rand.NewPCG(3, 4))
	keys := make([]uint64, 500)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	added := inv.Add(0, keys)
	st := inv.Stats()
	if inv.Count(0) != 2 || inv.Len() != 2 {
		t.Fatalf("Count %d Len %d, want 2, 2", inv.Count(0), inv.Len())
	}
	if st.DroppedAtBound == 0 || uint64(added) != 2+st.EvictedAtBound || uint64(added)+st.DroppedAtBound != 500 {
		t.Fatalf("added %d, stats %+v: want added = 2 + evicted and added + dropped = 500", added, st)
	}
}

// TestMemoryFollowsInventory: tables grow with the keys, and shrink back after removes
// and clears, within the per-key budget.
func TestMemoryFollowsInventory(t *testing.T) {
	inv, _ := New(Config{Endpoints: 8, Shards: 8})
	empty := inv.MemoryBytes()
	r := rand.New(rand.NewPCG(5, 6))
	keys := make([]uint64, 100_000)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	for i := 0; i < len(keys); i += 1000 {
		inv.Add(i/1000%8, keys[i:i+1000])
	}
	if inv.Len() != len(keys) {
		t.Fatalf("Len = %d", inv.Len())
	}
	if perKey := float64(inv.MemoryBytes()-empty) / float64(len(keys)); perKey > 24 || perKey < 16 {
		t.Errorf("%.1f bytes per key, want 16..24", perKey)
	}
	full := inv.MemoryBytes()
	for ep := 0; ep < 8; ep++ {
		inv.ClearEndpoint(ep)
	}
	if inv.Len() != 0 || inv.MemoryBytes() > full/8 {
		t.Errorf("after clearing: Len %d, %d bytes (full %d)", inv.Len(), inv.MemoryBytes(), full)
	}
	for i := 0; i < len(keys); i += 1000 {
		inv.Add(0, keys[i:i+1000])
	}
	inv.Remove(0, keys[:len(keys)*9/10])
	if got := inv.MemoryBytes(); got > full/4 {
		t.Errorf("after removing 90%%: %d bytes (full %d)", got, full)
	}
	inv.ClearAll()
	if inv.Len() != 0 || inv.Count(0) != 0 || inv.MemoryBytes() != empty {
		t.Errorf("ClearAll: Len %d Count %d bytes %d (empty %d)", inv.Len(), inv.Count(0), inv.MemoryBytes(), empty)
	}
}

func TestScoreAllocatesNothing(t *testing.T) {
	for _, endpoints := range []int{8, 300} {
		inv, _ := New(Config{Endpoints: endpoints})
		r := rand.New(rand.NewPCG(7, 8))
		keys := make([]uint64, 512)
		for i := range keys {
			keys[i] = r.Uint64()
		}
		for ep := 0; ep < endpoints; ep += 7 {
			inv.Add(ep, keys[:256+ep%200])
		}
		elig := NewMask(endpoints)
		elig.SetAll(endpoints)
		scores := make([]int32, endpoints)
		for _, mode := range []Mode{Overlap, Prefix} {
			if a := testing.AllocsPerRun(100, func() { inv.Score(keys, elig, mode, scores) }); a != 0 {
				t.Errorf("endpoints=%d %v: %.1f allocs per Score", endpoints, mode, a)
			}
		}
		if scores[0] == 0 {
			t.Error("scores not filled")
		}
	}
}

// TestKeysArbitraryCursor: a cursor from a client (it travels through /debug/inventory)
// may be anything; Keys must neither panic nor loop.
func TestKeysArbitraryCursor(t *testing.T) {
	inv, _ := New(Config{Endpoints: 2, Shards: 4})
	inv.Add(1, []uint64{0, 1, 2, 3, 1 << 63})
	for _, c := range []uint64{1, 1 << 40, 3<<40 | 5, 4 << 40, 1<<40 - 1, ^uint64(0), 1 << 63} {
		keys, next := inv.Keys(1, c, 3, nil)
		if len(keys) > 3 {
			t.Errorf("cursor %#x: %d keys", c, len(keys))
		}
		for steps := 0; next != 0; steps++ {
			if steps > 10 {
				t.Fatalf("cursor %#x: paging does not end", c)
			}
			keys, next = inv.Keys(1, next, 3, keys)
		}
	}
	if got := listAll(t, inv, 1, 2); !slices.Equal(got, []uint64{0, 1, 2, 3, 1 << 63}) {
		t.Errorf("listing = %v", got)
	}
}

// TestWritesAllocateNothing: Add, AddHeld and Remove locate and apply a batch's chunks
// on the stack, so once the tables are sized (a rebuild allocates one, by design) and
// AddHeld's buffer has room, a batch of writes allocates nothing, narrow masks and
// sparse sets alike.
func TestWritesAllocateNothing(t *testing.T) {
	for _, eps := range []int{8, 1024} {
		inv, _ := New(Config{Endpoints: eps})
		keys := make([]uint64, 4096)
		for i := range keys {
			keys[i] = benchKey(uint64(i))
		}
		inv.Add(1, keys)
		batch := keys[:40] // two whole chunks and part of a third
		rebuilds := inv.Stats().Rebuilds
		held := make([]uint64, 0, len(batch))
		if a := testing.AllocsPerRun(100, func() {
			if inv.Remove(1, batch) != len(batch) || inv.Add(1, batch) != len(batch) {
				t.Fatal("a batch was not applied whole")
			}
			var n int
			if n, held = inv.AddHeld(1, batch, held[:0]); n != 0 || len(held) != len(batch) {
				t.Fatalf("a repeated batch: %d added, %d held, want 0 and %d", n, len(held), len(batch))
			}
		}); a != 0 {
			t.Errorf("endpoints=%d: %.1f allocations per batch, want 0", eps, a)
		}
		if inv.Stats().Rebuilds != rebuilds {
			t.Errorf("endpoints=%d: the churn rebuilt a table, so the test proves nothing", eps)
		}
		if inv.Count(1) != len(keys) || inv.Len() != len(keys) {
			t.Errorf("endpoints=%d: Count %d Len %d, want %d", eps, inv.Count(1), inv.Len(), len(keys))
		}
	}
}
