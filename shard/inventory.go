// Package shard is kvgate's inventory: an inverted index from block key to the set of
// endpoints holding that block (a bitmask up to 64 endpoints, a sparse set of endpoint
// ids for fleets of up to 1,024), split into shards by key bits, and the scoring that
// turns a prompt's key chain into per-endpoint overlap.
//
// Concurrency: readers (Score, Count, Len, Keys, MemoryBytes, Stats) never take a lock
// and never wait. Each shard's table is published through an atomic pointer (RCU, with
// the garbage collector as the grace period); writers (Add, Remove, ClearEndpoint) take
// one shard's mutex at a time (ClearAll takes them all, in order) and change a published
// table only by atomic stores of whole 64-bit words into slots that never move; growth,
// shrinking and tombstone compaction build a new table and publish it (table.go; large
// tables compact in the background while writers go on, compact.go). A seqlock was the
// alternative: it would let writers move keys (Robin Hood, backward-shift delete) but
// would make readers retry while a writer is preempted inside a shard, and a
// ClearEndpoint sweep would stall scoring; RCU plus immovable slots has no retry path.
//
// Consistency: a reader sees each mask word before or after a concurrent write, never
// torn. One Score is not a snapshot of the whole index (keys are read one after another
// while writers go on), which is what the router needs: the inventory is eventually
// consistent with the engines anyway.
package shard

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// DefaultMaxKeysPerEndpoint is the per-endpoint bound used when Config leaves it 0:
// 4,194,304 keys (40 to 96 MiB of index, by mask width, if no key is shared), four times
// the blocks of a large vLLM GPU pool (1M blocks of 16 tokens is 16M tokens of KV cache).
const DefaultMaxKeysPerEndpoint = 1 << 22

// MaxShards bounds Config.Shards.
const MaxShards = 1 << 12

// fleetShards is the default shard count of rules of more than 64 endpoints. Why: a
// fleet's index runs to 10-100M entries, and a shard's rebuild (growth, or compaction
// under churn) re-inserts all of its keys while that shard's writers wait: at 100M
// entries 8 shards (2 cores) make that ~5M keys, about a second of stalled events,
// 256 make it ~200K. Empty shards cost ~1 KiB each.
const fleetShards = 256

// Config fixes an inventory's shape for the rule's life.
type Config struct {
	// Endpoints is the mask width: endpoint indexes are [0, Endpoints). 1..1024; rules of
	// up to 64 endpoints keep the mask inline in the index (the fast path), packed as
	// narrow as the count allows: 1 byte per key up to 8 endpoints, 2 up to 16, 4 up
	// to 32 (see layoutFor: narrower masks mean fewer bytes per key and faster writes).
	// Wider rules (a fleet) keep up to four endpoint ids inline per key and spill to a
	// bitmask only for keys held by more (sparse.go): 16 bytes per slot either way.
	Endpoints int
	// Shards is the number of shards, a power of two up to MaxShards; 0 sizes it from
	// GOMAXPROCS (4 per P, at least 8, at most 256), so writers rarely share a shard,
	// and to fleetShards for rules of more than 64 endpoints.
	Shards int
	// MaxKeysPerEndpoint bounds the keys one endpoint may hold, so a stream that misses
	// removes cannot grow memory forever; 0 means DefaultMaxKeysPerEndpoint.
	//
	// At the bound, Add makes room by evicting another key of the same endpoint from the
	// new key's shard (scanning from a point the new key's hash picks, at most 1,024
	// slots): newer keys are likelier to be live on the engine than ones whose removal
	// was missed. Each such eviction is counted in Stats.EvictedAtBound. When no victim
	// is found within the scan, the new key is not added and is counted in
	// Stats.DroppedAtBound. Concurrent writers of one endpoint may overshoot the bound by
	// at most one chunk of a batch (16 keys) each: a writer's count changes reach the
	// others once per chunk (see epCount).
	MaxKeysPerEndpoint int
}

// Stats are the inventory's counters, for metrics. Counters only grow; Keys, Slots,
// Tombstones and MemoryBytes are gauges read without locks (approximate while writers run).
type Stats struct {
	Keys               int64  // unique keys held by at least one endpoint
	Slots              int64  // slots allocated across shards
	Tombstones         int64  // slots of keys no endpoint holds any more, until the next rebuild
	Spilled            int64  // keys whose endpoint set spilled to an out-of-line list or bitmask (> 64 endpoints)
	MemoryBytes        int64  // bytes held by the index
	Shards             int    // shard count
	MaxKeysPerEndpoint int    // the bound in force
	Added              uint64 // (endpoint, key) pairs added
	Removed            uint64 // (endpoint, key) pairs removed by Remove
	EvictedAtBound     uint64 // (endpoint, key) pairs evicted to admit a newer key at the bound
	DroppedAtBound     uint64 // new keys not added at the bound (no victim found)
	BadEndpoint        uint64 // calls naming an endpoint outside [0, Endpoints); ignored
	Rebuilds           uint64 // shard tables rebuilt (grow, shrink or tombstone compaction)
	CompactionsDropped uint64 // background compactions given up (compact.go); a rebuild under the lock took over
	EndpointClears     uint64 // ClearEndpoint calls
	AllClears          uint64 // ClearAll calls
}

// shardState is a shard's writer side, padded to its own cache lines so writers of
// neighbouring shards do not share a line (and readers, who only read the table
// pointers in Inventory.tabs, never touch these lines).
type shardState struct {
	mu   sync.Mutex
	live int // keys with a non-zero mask (including key 0); under mu
	used int // claimed slots: live + tombstones (key 0 excluded); under mu
	// trigger: the used slots at which a new key rebuilds the table (compactTrigger);
	// under mu.
	trigger int
	// compaction is the background compaction of this shard's table (compact.go), set
	// from the moment one is started until it publishes or gives up; under mu.
	compaction *compaction
	// copying is the table a compaction is copying into, for MemoryBytes (lock-free).
	copying atomic.Pointer[table]
	// liveGauge mirrors live for the lock-free readers (Len, Stats), stored once per
	// hold of mu that changed it rather than once per key.
	liveGauge atomic.Int64
	// usedGauge mirrors used for Stats, which must not read used without the mutex;
	// it is refreshed every 64 claims and on every rebuild.
	usedGauge atomic.Int64
	_         [128 - 8 - 8 - 8 - 8 - 8 - 8 - 8 - 8]byte
}

// publishLive refreshes liveGauge after a hold of mu that may have changed live.
func (sh *shardState) publishLive() {
	if n := int64(sh.live); sh.liveGauge.Load() != n {
		sh.liveGauge.Store(n)
	}
}

type paddedCount struct {
	n atomic.Int64
	_ [56]byte
}

// Inventory is the sharded key -> endpoint-mask index. All methods are safe for
// concurrent use; readers never block.
type Inventory struct {
	endpoints int
	words     int
	shardBits uint
	shift     uint // 64 - shardBits: h >> shift is the shard
	maxPerEP  int64
	lay       layout // how tables pack slots (by mask width)

	tabs   []atomic.Pointer[table] // read side, written only on rebuild and ClearAll
	shards []shardState
	counts []paddedCount // keys held per endpoint
	// clearEpoch counts ClearAll calls; written holding every shard's mutex, so read
	// under any one of them (epCount).
	clearEpoch uint64

	added, removed, evicted, dropped, badEP, rebuilds, epClears, allClears atomic.Uint64
	compactDrops                                                           atomic.Uint64

	// compactMinSlots is the package's compactMinSlots, or a test's own.
	compactMinSlots int
	// compactHook, when set (tests only, before any write), runs in a compaction between
	// the copy and the publish with no lock held, so a test can write into the table
	// being copied deterministically. A field, not a package variable: a compaction
	// another test left running must not run this test's hook.
	compactHook func()
}

// New builds an empty inventory.
func New(cfg Config) (*Inventory, error) {
	if cfg.Endpoints < 1 || cfg.Endpoints > MaxEndpoints {
		return nil, fmt.Errorf("shard: endpoints %d out of range 1..%d", cfg.Endpoints, MaxEndpoints)
	}
	n := cfg.Shards
	if n == 0 {
		n = 8
		for n < 4*runtime.GOMAXPROCS(0) && n < 256 {
			n *= 2
		}
		if cfg.Endpoints > 64 {
			n = max(n, fleetShards)
		}
	}
	if n < 1 || n > MaxShards || n&(n-1) != 0 {
		return nil, fmt.Errorf("shard: shards %d must be a power of two in 1..%d", cfg.Shards, MaxShards)
	}
	if cfg.MaxKeysPerEndpoint < 0 {
		return nil, errors.New("shard: max keys per endpoint must be >= 0 (0 = default)")
	}
	inv := &Inventory{
		endpoints: cfg.Endpoints,
		words:     (cfg.Endpoints + 63) / 64,
		maxPerEP:  int64(cfg.MaxKeysPerEndpoint),
		lay:       layoutFor(cfg.Endpoints),
		tabs:      make([]atomic.Pointer[table], n),
		shards:    make([]shardState, n),
		counts:    make([]paddedCount, cfg.Endpoints),

		compactMinSlots: compactMinSlots,
	}
	if inv.maxPerEP == 0 {
		inv.maxPerEP = DefaultMaxKeysPerEndpoint
	}
	for n > 1<<inv.shardBits {
		inv.shardBits++
	}
	inv.shift = 64 - inv.shardBits
	for i := range inv.tabs {
		t := newTable(minBuckets, inv.words, inv.lay)
		inv.tabs[i].Store(t)
		inv.shards[i].trigger = t.maxUsed()
	}
	return inv, nil
}

// Endpoints is the mask width the inventory was built with.
func (inv *Inventory) Endpoints() int { return inv.endpoints }

// Shards is the shard count.
func (inv *Inventory) Shards() int { return len(inv.shards) }

// MaxKeysPerEndpoint is the per-endpoint bound in force.
func (inv *Inventory) MaxKeysPerEndpoint() int { return int(inv.maxPerEP) }

// shardOf returns key's hash and shard index. With one shard, shift is 64 and Go
// defines h >> 64 as 0.
func (inv *Inventory) shardOf(key uint64) (h uint64, s int) {
	h = mix(key)
	return h, int(h >> inv.shift)
}

func (inv *Inventory) validEP(ep int) bool {
	if ep < 0 || ep >= inv.endpoints {
		inv.badEP.Add(1)
		return false
	}
	return true
}

// Add records that endpoint ep holds keys and returns how many it did not hold before
// (and now does). Keys it already holds are no-ops; an out-of-range ep adds nothing.
//
// The batch goes in chunks of scoreBatch keys: a chunk's home buckets are located and
// prefetched before any lock is taken (their misses overlap), then its keys are applied
// one shard at a time, each shard's mutex taken once for all of the chunk's keys in it.
func (inv *Inventory) Add(ep int, keys []uint64) (added int) {
	return inv.add(ep, keys, nil)
}

// AddHeld is Add, and appends to held (returned) each of keys that ep held already: the
// stores that were repeats, in no particular order. A caller that counts holders of its
// own learns which keys had one without asking again (ingest keeps counts only for
// hashes with more than one holder).
func (inv *Inventory) AddHeld(ep int, keys, held []uint64) (added int, _ []uint64) {
	added = inv.add(ep, keys, &held)
	return added, held
}

func (inv *Inventory) add(ep int, keys []uint64, held *[]uint64) (added int) {
	if !inv.validEP(ep) {
		return 0
	}
	var evicted, dropped int
	cnt := epCount{n: &inv.counts[ep].n}
	var c writeChunk
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), scoreBatch)]
		keys = keys[len(chunk):]
		c.locate(inv, chunk, true)
		for r := 0; r < len(chunk); {
			s := chunkShard(c.order[r])
			sh := &inv.shards[s]
			sh.mu.Lock()
			cnt.locked(inv)
			for ; r < len(chunk) && chunkShard(c.order[r]) == s; r++ {
				i := chunkPos(c.order[r])
				switch inv.addLocked(s, sh, ep, chunk[i], c.hash[i], c.tab[i], c.home[i], &cnt) {
				case addHeld:
					if held != nil {
						*held = append(*held, chunk[i])
					}
				case addNew:
					added++
				case addEvicted:
					added++
					evicted++
				case addDropped:
					dropped++
				}
			}
			sh.publishLive()
			if r == len(chunk) {
				cnt.flush()
			}
			sh.mu.Unlock()
		}
	}
	if added > 0 {
		inv.added.Add(uint64(added))
	}
	if evicted > 0 {
		inv.evicted.Add(uint64(evicted))
	}
	if dropped > 0 {
		inv.dropped.Add(uint64(dropped))
	}
	return added
}

// writeChunk is up to scoreBatch keys of an Add or Remove batch, located (hash and home
// bucket in the shard's table of the moment) with the lines their writes will read
// prefetched, and ordered by shard so that each shard's keys are applied in one hold of
// its mutex. A table rebuilt between locate and lock moves the home, which the writer
// then computes again.
type writeChunk struct {
	hash [scoreBatch]uint64
	tab  [scoreBatch]*table
	home [scoreBatch]uint64
	// order is shard<<4 | position of each key, ascending: the keys of a shard are
	// adjacent, in batch order (a key repeated in a chunk keeps its order).
	order [scoreBatch]uint16
}

// An order entry holds a shard index above a chunk position.
var _ [1<<16 - MaxShards*scoreBatch]struct{}

func chunkShard(o uint16) int { return int(o >> 4) }
func chunkPos(o uint16) int   { return int(o & (scoreBatch - 1)) }

// locate fills c for keys (at most scoreBatch) and prefetches each key's home bucket.
// Tables of 4-slot buckets (rules of more than 32 endpoints, fleets among them) also get
// the word of the overflow bitmap that the home bucket's bit is in, and inserts (insert)
// the bucket after the home: a 4-slot bucket is full often enough that an insert walks
// on past it and a remove's tail trim reads its bit, and at fleet sizes the bitmap is
// megabytes, so each is a cache miss otherwise waited for under the mutex (measured at
// 100M entries: each gains about 4%, bench/RESULTS.md Session 5). Buckets of 5 to 7
// slots rarely overflow, and their rules' bitmaps are small: those lines would be
// prefetches spent for nothing.
func (c *writeChunk) locate(inv *Inventory, keys []uint64, insert bool) {
	keys = keys[:min(len(keys), scoreBatch)]
	var homes, ovfs, nexts [scoreBatch]unsafe.Pointer
	more := inv.lay.kpb == 4
	for i, k := range keys {
		h, s := inv.shardOf(k)
		t := inv.tabs[s].Load()
		b := t.home(h, inv.shardBits)
		c.hash[i], c.tab[i], c.home[i] = h, t, b
		homes[i] = unsafe.Pointer(&t.buckets[b])
		if more {
			ovfs[i] = unsafe.Pointer(&t.ovf[b/64])
			next := b + 1
			if next == t.nb {
				next = 0
			}
			nexts[i] = unsafe.Pointer(&t.buckets[next])
		}
		o := uint16(s)<<4 | uint16(i)
		j := i
		for ; j > 0 && c.order[j-1] > o; j-- {
			c.order[j] = c.order[j-1]
		}
		c.order[j] = o
	}
	prefetchLines(&homes[0], len(keys))
	if more {
		prefetchLines(&ovfs[0], len(keys))
		if insert {
			prefetchLines(&nexts[0], len(keys))
		}
	}
}

// epCount is a batch's change to one endpoint's key count, added to the shared count
// once per chunk instead of once per key (one atomic add on a line that every shard's
// writers of ep share). Why the count stays exact: every other writer's change is a sum,
// which commutes, except ClearAll's reset to zero, which it makes holding every shard's
// mutex after bumping clearEpoch. The change is added holding the chunk's last shard
// mutex, so no ClearAll falls between the last epoch check and the add; and it is
// dropped when a mutex taken since it began shows a new epoch: ClearAll emptied the
// tables the change was made in.
type epCount struct {
	n       *atomic.Int64
	pending int64
	epoch   uint64
}

// held is the endpoint's count including this batch's pending change.
func (c *epCount) held() int64 { return c.n.Load() + c.pending }

// locked is called on taking a shard's mutex.
func (c *epCount) locked(inv *Inventory) {
	if inv.clearEpoch != c.epoch {
		c.pending, c.epoch = 0, inv.clearEpoch
	}
}

// flush adds the pending change, under a shard's mutex.
func (c *epCount) flush() {
	if c.pending != 0 {
		c.n.Add(c.pending)
		c.pending = 0
	}
}

const (
	addHeld = iota
	addNew
	addEvicted
	addDropped
)

// addLocked adds k (hash h) for ep in shard s; home is k's home bucket in table located,
// which is still the shard's table unless a rebuild came between.
func (inv *Inventory) addLocked(s int, sh *shardState, ep int, k, h uint64, located *table, home uint64, cnt *epCount) int {
	t := inv.tabs[s].Load()
	if t != located {
		home = t.home(h, inv.shardBits)
	}
	slot, ok, free, reuse := t.findForInsert(k, home)
	if ok && t.has(slot, ep) {
		return addHeld
	}
	r := addNew
	if cnt.held() >= inv.maxPerEP {
		if !inv.evictLocked(t, sh, ep, k, h) {
			return addDropped
		}
		cnt.pending--
		r = addEvicted
		slot, ok, free, reuse = t.findForInsert(k, home)
	}
	switch {
	case !ok && reuse:
		t.reuse(free, k, ep) // a tombstone: stays counted in used
		sh.live++
	case !ok:
		if sh.used+1 > sh.limit(t) || free < 0 {
			t = inv.rebuildLocked(s, sh, sh.live+1)
			free = t.freeSlot(t.home(h, inv.shardBits))
		}
		// The free slot's mask words are zero: set the bit, then publish the key.
		t.setBit(free, ep)
		t.claim(free, k)
		sh.used++
		if sh.compaction == nil && sh.used >= sh.trigger-compactLead(t, sh.trigger) && t.capacity() >= inv.compactMinSlots {
			inv.startCompaction(s, sh)
		}
		if sh.used%64 == 0 {
			sh.usedGauge.Store(int64(sh.used)) // a gauge: coarse is enough
		}
		sh.live++
	default:
		if !t.live(slot) {
			sh.live++
		}
		t.setBit(slot, ep)
	}
	sh.noteDirty(k)
	cnt.pending++
	return r
}

// evictLocked clears ep's bit on one other key of t, scanning from a point k's hash picks.
// The caller counts the eviction.
func (inv *Inventory) evictLocked(t *table, sh *shardState, ep int, k, h uint64) bool {
	b := t.home(h*0x9e3779b97f4a7c15, 0)
	n := uint64(evictScanBuckets)
	if n > t.nb {
		n = t.nb
	}
	for i := uint64(0); i < n; i++ {
		for j := 0; j < t.kpb; j++ {
			slot := slotOf(b, j)
			if vk := t.key(slot); vk != 0 && vk != k && t.has(slot, ep) {
				inv.clearLocked(t, sh, slot, ep)
				return true
			}
		}
		if b++; b == t.nb {
			b = 0
		}
	}
	if k != 0 && t.has(zeroSlot, ep) {
		inv.clearLocked(t, sh, zeroSlot, ep)
		return true
	}
	return false
}

// clearLocked clears ep's bit on slot, which holds it; the caller counts it off ep's
// count.
func (inv *Inventory) clearLocked(t *table, sh *shardState, slot, ep int) {
	if slot == zeroSlot {
		sh.noteDirty(0)
	} else {
		sh.noteDirty(t.key(slot))
	}
	t.clearBit(slot, ep)
	if !t.live(slot) {
		sh.live--
		if n := t.trimTail(slot); n > 0 {
			sh.used -= n
			sh.usedGauge.Store(int64(sh.used))
		}
	}
}

// rebuildLocked publishes a copy of shard s's table sized for want live keys, without
// tombstones, and returns it.
func (inv *Inventory) rebuildLocked(s int, sh *shardState, want int) *table {
	old := inv.tabs[s].Load()
	nb := bucketsFor(want, inv.lay)
	nt := newTable(nb, inv.words, inv.lay)
	n := old.copyLiveInto(nt, inv.shardBits, false)
	inv.tabs[s].Store(nt)
	retireTable(old)
	sh.used = n
	sh.trigger = compactTrigger(nt, n, uint64(s)<<32|inv.rebuilds.Load())
	sh.usedGauge.Store(int64(n))
	inv.rebuilds.Add(1)
	return nt
}

// compactTrigger is where a table rebuilt with used slots in use rebuilds next: somewhere
// in the upper half of its headroom up to maxUsed, drawn from seed (the shard and the
// rebuild count). Why: under steady churn (as many removes as stores) the used slots of
// every shard grow at the same rate, from the same load, in tables of the same size (a
// fleet's 256 shards hold equal shares, and huge-page rounding makes their tables equal),
// so with one trigger they all compacted within a few seconds of each other: at 100M
// entries, 256 rebuilds of ~25 ms holding their shards' locks back to back, which stalled
// ingest for seconds (event lag p99 ~0.5 s, bench/RESULTS.md, session 8). Triggers spread
// over half the headroom spread the rebuilds over the churn instead, each shard's next
// one redrawn, so they do not fall back into step.
func compactTrigger(t *table, used int, seed uint64) int {
	max := t.maxUsed()
	if used >= max {
		return max
	}
	headroom := uint64(max - used)
	return max - int(headroom/2*(mix(seed)>>40)>>24)
}

// maybeShrinkLocked rebuilds a table whose live keys fill under 1/shrinkLoadDen of it.
func (inv *Inventory) maybeShrinkLocked(s int, sh *shardState) {
	t := inv.tabs[s].Load()
	live := sh.live
	if t.nb > minBuckets && live*shrinkLoadDen < t.capacity() && bucketsFor(live, inv.lay) < t.nb {
		inv.rebuildLocked(s, sh, live)
	}
}

// Remove records that endpoint ep no longer holds keys and returns how many it held.
// It goes in chunks as Add does.
func (inv *Inventory) Remove(ep int, keys []uint64) (removed int) {
	if !inv.validEP(ep) {
		return 0
	}
	cnt := epCount{n: &inv.counts[ep].n}
	var c writeChunk
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), scoreBatch)]
		keys = keys[len(chunk):]
		c.locate(inv, chunk, false)
		for r := 0; r < len(chunk); {
			s := chunkShard(c.order[r])
			sh := &inv.shards[s]
			sh.mu.Lock()
			cnt.locked(inv)
			t := inv.tabs[s].Load()
			before := cnt.pending
			for ; r < len(chunk) && chunkShard(c.order[r]) == s; r++ {
				i := chunkPos(c.order[r])
				home := c.home[i]
				if t != c.tab[i] {
					home = t.home(c.hash[i], inv.shardBits)
				}
				if slot, ok := t.find(chunk[i], home); ok && t.has(slot, ep) {
					inv.clearLocked(t, sh, slot, ep)
					cnt.pending--
				}
			}
			if cnt.pending != before {
				removed += int(before - cnt.pending)
				inv.maybeShrinkLocked(s, sh)
				sh.publishLive()
			}
			if r == len(chunk) {
				cnt.flush()
			}
			sh.mu.Unlock()
		}
	}
	if removed > 0 {
		inv.removed.Add(uint64(removed))
	}
	return removed
}

// clearChunkSlots is how many slots ClearEndpoint sweeps per hold of a shard's mutex,
// so writers of that shard wait at most one chunk (readers never wait at all).
const clearChunkSlots = 4096

// clearChunkHook, when set (tests only), runs between ClearEndpoint's chunks, with no
// lock held, so a test can rebuild the table under the sweep deterministically.
var clearChunkHook func()

// clearMaxRestarts is how many times a rebuild may restart one shard's chunked sweep
// before ClearEndpoint sweeps that shard in a single hold of its mutex.
const clearMaxRestarts = 2

// ClearEndpoint drops every key endpoint ep holds (an engine restart, a prefix-cache
// reset, a seq gap). It sweeps one shard chunk at a time; scoring runs on throughout and
// sees ep's bits vanish key by key.
func (inv *Inventory) ClearEndpoint(ep int) {
	if !inv.validEP(ep) {
		return
	}
	inv.epClears.Add(1)
	cnt := &inv.counts[ep].n
	for s := range inv.shards {
		sh := &inv.shards[s]
		var seen *table
		restarts := 0
		for pos, cleared := 0, int64(0); ; {
			sh.mu.Lock()
			if c := sh.compaction; c != nil {
				c.stale = true // a sweep changes too many keys to replay (compact.go)
			}
			t := inv.tabs[s].Load()
			if t != seen {
				// First chunk, or a writer rebuilt the table between chunks: sweep the
				// new table from the start (clearing is idempotent).
				if seen != nil {
					restarts++
				}
				seen, pos = t, 0
				if t.has(zeroSlot, ep) {
					inv.clearLocked(t, sh, zeroSlot, ep)
					cleared++
				}
			}
			chunk := clearChunkSlots
			if restarts >= clearMaxRestarts {
				// Writers keep rebuilding this shard under the sweep: finish it in one
				// hold so the clear ends. Writers wait for it; readers still do not.
				chunk = t.slots()
			}
			end := min(pos+chunk, t.slots())
			for slot := pos; slot < end; slot++ {
				if t.key(slot) != 0 && t.has(slot, ep) {
					inv.clearLocked(t, sh, slot, ep)
					cleared++
				}
			}
			pos = end
			done := pos >= t.slots()
			if done {
				inv.maybeShrinkLocked(s, sh)
			}
			// Counted in the hold that cleared them, so ClearAll's reset cannot fall
			// between (see epCount).
			if cleared > 0 {
				cnt.Add(-cleared)
				cleared = 0
			}
			sh.publishLive()
			sh.mu.Unlock()
			if done {
				break
			}
			if clearChunkHook != nil {
				clearChunkHook()
			}
		}
	}
}

// ClearAll drops every key of every endpoint. It holds every shard's mutex at once (in
// shard order, so it cannot deadlock with writers, who hold one) to reset the
// per-endpoint counts consistently; readers keep reading the old tables meanwhile.
func (inv *Inventory) ClearAll() {
	inv.allClears.Add(1)
	for s := range inv.shards {
		inv.shards[s].mu.Lock()
	}
	inv.clearEpoch++
	for s := range inv.shards {
		t := newTable(minBuckets, inv.words, inv.lay)
		retireTable(inv.tabs[s].Swap(t))
		inv.shards[s].trigger = t.maxUsed()
		inv.shards[s].used = 0
		inv.shards[s].usedGauge.Store(0)
		inv.shards[s].live = 0
		inv.shards[s].liveGauge.Store(0)
	}
	for i := range inv.counts {
		inv.counts[i].n.Store(0)
	}
	for s := range inv.shards {
		inv.shards[s].mu.Unlock()
	}
}

// Count is the number of keys endpoint ep holds (0 for an out-of-range ep).
func (inv *Inventory) Count(ep int) int {
	if ep < 0 || ep >= inv.endpoints {
		return 0
	}
	return int(inv.counts[ep].n.Load())
}

// Len is the number of unique keys held by at least one endpoint.
func (inv *Inventory) Len() int {
	n := int64(0)
	for s := range inv.shards {
		n += inv.shards[s].liveGauge.Load()
	}
	return int(n)
}

// MemoryBytes is the memory the index holds: tables, shard state and counters.
func (inv *Inventory) MemoryBytes() int64 {
	n := int64(len(inv.shards))*128 + int64(len(inv.tabs))*8 + int64(len(inv.counts))*64 + 256
	for s := range inv.tabs {
		n += inv.tabs[s].Load().bytes()
		if ct := inv.shards[s].copying.Load(); ct != nil {
			n += ct.bytes()
		}
	}
	return n
}

// Stats returns the counters and gauges.
func (inv *Inventory) Stats() Stats {
	st := Stats{
		Keys:               int64(inv.Len()),
		MemoryBytes:        inv.MemoryBytes(),
		Shards:             len(inv.shards),
		MaxKeysPerEndpoint: int(inv.maxPerEP),
		Added:              inv.added.Load(),
		Removed:            inv.removed.Load(),
		EvictedAtBound:     inv.evicted.Load(),
		DroppedAtBound:     inv.dropped.Load(),
		BadEndpoint:        inv.badEP.Load(),
		Rebuilds:           inv.rebuilds.Load(),
		CompactionsDropped: inv.compactDrops.Load(),
		EndpointClears:     inv.epClears.Load(),
		AllClears:          inv.allClears.Load(),
	}
	used := int64(0)
	for s := range inv.tabs {
		t := inv.tabs[s].Load()
		st.Slots += int64(t.capacity())
		st.Spilled += t.spilled.Load()
		used += inv.shards[s].usedGauge.Load()
	}
	// Key 0 is live without a slot, so this may undercount by one.
	st.Tombstones = max(0, used-st.Keys)
	return st
}

// Keys pages through the keys endpoint ep holds, for /debug/inventory: it appends up to
// limit keys (1,024 when limit <= 0) to dst and returns it with the cursor of the next
// page. Start with cursor 0 and stop when next is 0. Lock-free; a key added or removed
// while paging, or a shard rebuilt between pages, may be listed twice or missed.
func (inv *Inventory) Keys(ep int, cursor uint64, limit int, dst []uint64) (out []uint64, next uint64) {
	if ep < 0 || ep >= inv.endpoints {
		return dst, 0
	}
	if limit <= 0 {
		limit = 1024
	}
	// A cursor is shard<<40 | v, where v = 0 is the shard's key-0 mask and v = i+1 is
	// slot i. Cursor 0 is therefore the start, and no later position encodes to 0.
	s, v := int(cursor>>40), int(cursor&(1<<40-1))
	for n := 0; s < len(inv.tabs); s, v = s+1, 0 {
		t := inv.tabs[s].Load()
		for ; v <= t.slots(); v++ {
			if n == limit {
				return dst, uint64(s)<<40 | uint64(v)
			}
			slot := v - 1
			if v == 0 {
				slot = zeroSlot
			} else if t.key(slot) == 0 {
				continue
			}
			if t.has(slot, ep) {
				dst = append(dst, t.key(slot))
				n++
			}
		}
	}
	return dst, 0
}
