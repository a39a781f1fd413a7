package shard

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestCompactionInBackground: a table nearing its trigger is compacted by a goroutine of
// its own, without the shard's mutex during the copy: writes made while it copies (new
// keys, removes, sets that spill and go back inline, key 0, a key removed and stored
// again) all reach the table it publishes, whose used count is its own. Then a sweep
// under a copy (ClearEndpoint) drops that copy, and the index still matches the model.
func TestCompactionInBackground(t *testing.T) {
	const eps = 1024
	inv, err := New(Config{Endpoints: eps, Shards: 1, MaxKeysPerEndpoint: 1 << 24})
	if err != nil {
		t.Fatal(err)
	}
	inv.compactMinSlots = 1 << 11
	sh := &inv.shards[0]
	m := newModel(eps)
	r := rand.New(rand.NewPCG(7, 8))
	fresh := freshKeys()
	add := func(ep int, keys []uint64) {
		if got, want := inv.Add(ep, keys), m.add(ep, keys); got != want {
			t.Fatalf("Add(%d) = %d, model %d", ep, got, want)
		}
	}
	remove := func(ep int, keys []uint64) {
		if got, want := inv.Remove(ep, keys), m.remove(ep, keys); got != want {
			t.Fatalf("Remove(%d) = %d, model %d", ep, got, want)
		}
	}
	// Keys held by many endpoints (spilled sets) among keys held by one.
	shared := fresh(40)
	for ep := 0; ep < 12; ep++ {
		add(ep, shared)
	}
	var held [][]uint64
	for inv.tabs[0].Load().capacity() < 2*inv.compactMinSlots {
		k := fresh(64)
		add(1+r.IntN(eps-1), k)
		held = append(held, k)
	}
	ks := append([]uint64{0}, shared...)
	for _, k := range held {
		ks = append(ks, k...)
	}

	inv.waitCompactions() // the fill's own are done

	// The hook waits at the copy's end until the churn below stops, then writes.
	at, proceed, ran := make(chan struct{}), make(chan struct{}), make(chan struct{}, 1)
	var during []uint64
	inv.compactHook = func() {
		defer func() { inv.compactHook = nil; ran <- struct{}{} }()
		at <- struct{}{}
		<-proceed
		if !sh.mu.TryLock() {
			t.Error("the shard's mutex is held during the copy")
			return
		}
		sh.mu.Unlock()
		during = fresh(300)
		add(5, during)                   // new keys
		remove(1+r.IntN(eps-1), held[0]) // removes (whoever holds them)
		remove(0, shared[:10])           // spilled sets lose a holder
		for ep := 100; ep < 110; ep++ {
			add(ep, during[:20]) // inline sets spill
		}
		for ep := 0; ep < 12; ep++ {
			remove(ep, shared[10:15]) // spilled sets emptied: tombstones
		}
		add(3, []uint64{0})
		remove(5, during[250:])
		add(5, during[250:260]) // removed and stored again
	}
	before := inv.tabs[0].Load()
	rebuilds := inv.rebuilds.Load()
	// Churn (store new keys, remove the oldest) until a compaction has copied: the
	// churn during the copy goes through the dirty log too.
	churn := func() {
		k := fresh(64)
		add(7, k)
		remove(7, held[len(held)-1])
		held = append(held[:len(held)-1], k)
		ks = append(ks, k...)
	}
	// churnUntilCopied churns until the hook reports a copy done, calling check first
	// each round.
	churnUntilCopied := func(check func()) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			select {
			case <-at:
				return
			default:
			}
			check()
			if time.Now().After(deadline) {
				t.Fatal("no compaction copied the table")
			}
			churn()
		}
	}
	churnUntilCopied(func() {
		if inv.tabs[0].Load() != before {
			t.Fatal("the table was rebuilt under the mutex before a compaction copied it")
		}
	})
	close(proceed)
	<-ran
	deadline := time.Now().Add(20 * time.Second)
	for inv.tabs[0].Load() == before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	nt := inv.tabs[0].Load()
	if nt == before || inv.rebuilds.Load() != rebuilds+1 {
		t.Fatalf("the compaction did not publish one table (rebuilds %d -> %d)", rebuilds, inv.rebuilds.Load())
	}
	ks = append(ks, during...)
	checkAgainstModel(t, r, inv, m, ks, make([]int32, eps))
	holders := m.holders()
	for _, k := range ks {
		if got, want := nt.lookup(k, nt.home(mix(k), inv.shardBits)) != 0, holders[k] > 0; got != want {
			t.Fatalf("key %#x: in the published table %v, held in the model %v", k, got, want)
		}
	}
	sh.mu.Lock()
	used, claimed := sh.used, nt.claimedSlots()
	sh.mu.Unlock()
	if used != claimed {
		t.Fatalf("used = %d, the published table has %d claimed slots", used, claimed)
	}

	// A sweep under the copy: the compaction is dropped, nothing is lost.
	inv.compactHook = func() {
		defer func() { inv.compactHook = nil; ran <- struct{}{} }()
		inv.ClearEndpoint(5)
		m.clearEndpoint(5)
		at <- struct{}{}
	}
	drops := inv.Stats().CompactionsDropped
	churnUntilCopied(func() {})
	<-ran
	inv.waitCompactions()
	if inv.Stats().CompactionsDropped != drops+1 {
		t.Fatal("a compaction under a sweep published its copy")
	}
	checkAgainstModel(t, r, inv, m, ks, make([]int32, eps))
}

// holders is the number of endpoints holding each key.
func (m *model) holders() map[uint64]int {
	n := map[uint64]int{}
	for _, held := range m.eps {
		for k := range held {
			n[k]++
		}
	}
	return n
}

// claimedSlots counts t's slots holding a key, live or tombstone (key 0 excluded).
func (t *table) claimedSlots() int {
	n := 0
	for slot := 0; slot < t.slots(); slot++ {
		if t.key(slot) != 0 {
			n++
		}
	}
	return n
}

// waitCompactions waits until no shard has a compaction running, so that a check sees
// one table per shard throughout (Keys may list a key twice across a publish; Stats and
// MemoryBytes count a copy in flight).
func (inv *Inventory) waitCompactions() {
	for s := range inv.shards {
		sh := &inv.shards[s]
		for {
			sh.mu.Lock()
			busy := sh.compaction != nil
			sh.mu.Unlock()
			if !busy && sh.copying.Load() == nil {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// TestCompactionKeyCopiedTwice: a key removed after the copy passed its bucket, its slot
// then taken by another key, and the key stored again in a bucket the copy has not reached
// is copied twice. The publish must leave it one slot with its set: a second copy with a
// stale set would be listed twice, and would surface once the first was removed.
func TestCompactionKeyCopiedTwice(t *testing.T) {
	inv, err := New(Config{Endpoints: 4, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	sh := &inv.shards[0]
	tab := inv.tabs[0].Load()
	// kpb+1 keys homed at bucket 0: the first kpb fill it, the last takes a tombstone.
	var h []uint64
	for i := uint64(1); len(h) <= tab.kpb; i++ {
		if k := benchKey(i); tab.home(mix(k), inv.shardBits) == 0 {
			h = append(h, k)
		}
	}
	k := h[0]
	inv.Add(0, h[:tab.kpb])

	// A compaction, its copy run by hand in two parts around the writes.
	sh.mu.Lock()
	c := &compaction{from: tab}
	sh.compaction = c
	sh.mu.Unlock()
	nt := newTable(tab.nb, inv.words, inv.lay)
	n := tab.copyBuckets(nt, inv.shardBits, 0, 1)
	inv.Remove(0, []uint64{k}) // a tombstone in bucket 0, not its last slot: kept
	inv.Add(1, h[tab.kpb:])    // takes the tombstone's slot
	inv.Add(0, []uint64{k})    // bucket 0 is full: k goes to bucket 1
	if inv.tabs[0].Load() != tab {
		t.Fatal("the writes rebuilt the table")
	}
	if slot, ok := tab.find(k, 0); !ok || slot>>slotShift != 1 {
		t.Fatalf("k is at slot %d (found %v), want bucket 1", slot, ok)
	}
	n += tab.copyBuckets(nt, inv.shardBits, 1, tab.nb)
	inv.publishCompaction(0, sh, c, nt, n)
	if inv.tabs[0].Load() != nt {
		t.Fatal("the compaction was not published")
	}

	live := 0
	for slot := 0; slot < nt.slots(); slot++ {
		if nt.key(slot) == k && nt.live(slot) {
			live++
		}
	}
	if live != 1 {
		t.Fatalf("k is live in %d slots of the published table, want 1", live)
	}
	if got := listAll(t, inv, 0, 0); len(got) != tab.kpb {
		t.Fatalf("endpoint 0 lists %d keys, holds %d", len(got), tab.kpb)
	}
	inv.Remove(0, []uint64{k})
	if got := listAll(t, inv, 0, 0); slices.Contains(got, k) || len(got) != tab.kpb-1 {
		t.Fatalf("after removing k, endpoint 0 lists %d keys (k among them: %v)", len(got), slices.Contains(got, k))
	}
	sh.mu.Lock()
	used, claimed := sh.used, nt.claimedSlots()
	sh.mu.Unlock()
	if used != claimed {
		t.Fatalf("used = %d, the published table has %d claimed slots", used, claimed)
	}
}
