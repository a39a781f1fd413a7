package hashcore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// ChainMemo remembers one contract's chain per block prefix, so that a follow-up prompt,
// which repeats an earlier prompt's blocks, runs the contract's hash only on its new blocks.
//
// Block i's key and digest depend only on blocks 0..i and the extras (every contract's
// AppendKeys chains on the parent's full digest alone), so a prefix's identity is enough to
// recall them. The memo works in stretches of memoStretch blocks counted from block 0: an
// entry holds the keys of one stretch and the full digest after it, under the identity of
// the whole prefix up to the stretch's end. A lookup walks the prompt's full stretches from
// the first while they hit, then resumes the contract's chain from the last digest; the
// blocks after the last full stretch (fewer than memoStretch) are always hashed.
//
// The identity is a 128-bit chain over the stretches' token bytes, one XXH3-128 per stretch:
//
//	out = XXH3-128(stretch s, seed = lo(s-1) ^ mix),  id(s) = (hi(s-1) ^ out.hi, out.lo)
//
// with id(-1) = (memoRootHi, 0), and mix the LoRA name's hash on every stretch, xor the
// cache salt's on stretch 0, so that prompts with other extras never share an entry. The
// high word carries the whole previous identity, so two prefixes share an identity only if
// they collide in all 128 bits: about entries/2^128 per lookup, never in practice. (A
// per-block 64-bit key such as NewFast's would cost a lookup and a hash per block, and at
// 64 bits a busy proxy would see a false hit every few days.)
//
// Entries live in a fixed table of 128-byte slots, sized from the byte bound when the memo
// is made and never grown: an identity's low word picks a set of chainMemoWays slots. Each
// slot's identity low word is kept again in a tag table, a set's tags in one cache line,
// so that a lookup reads one line per set and follows only the way whose tag matches, and
// a walk loads the tags of a batch of stretches together (their misses overlap).
// Readers take no lock: each slot is a seqlock of atomic words (an odd sequence while
// written, re-checked after the read). Writers claim a slot with a compare-and-swap and skip
// it when another writer holds it; a full set evicts a random way. Nothing allocates.
type ChainMemo struct {
	chain     Chain
	blockSize int
	slots     []chainSlot
	tags      []atomic.Uint64 // per slot: its entry's id.lo, stored after the entry
	sets      uint64          // a power of two
	maxBytes  int64

	entries                          atomic.Int64
	hits, misses, inserts, evictions atomic.Uint64
}

// chainSlot is one entry; its words are atomics so that the seqlock is race-free.
type chainSlot struct {
	// seq: 0 empty; bit 0 set while a writer fills the slot; bits 2-7 the digest's
	// length; bits 8+ a version that every write bumps.
	seq    atomic.Uint64
	hi, lo atomic.Uint64 // the prefix's identity
	digest [4]atomic.Uint64
	keys   [memoStretch]atomic.Uint64
	_      atomic.Uint64 // pads the slot to two cache lines
}

const (
	// DefaultChainMemoBytes is the suggested bound: 256Ki stretches, e.g. ~7,000
	// conversations of ~4.7k tokens at 16 tokens per block.
	DefaultChainMemoBytes = 32 << 20
	// MinChainMemoBytes is the smallest bound NewChainMemo accepts.
	MinChainMemoBytes = 64 << 10

	// memoStretch is the blocks per entry. A follow-up re-hashes the fewer than
	// memoStretch blocks after its prefix's last full stretch, plus its new blocks.
	memoStretch    = 8
	chainSlotBytes = int64(unsafe.Sizeof(chainSlot{}))
	chainMemoWays  = 4

	seqWriting  = 1
	seqLenShift = 2

	memoRootHi     = 0x6b76676174652f6d // "kvgate/m"
	memoLoRADomain = 0x6b76676174652f4c // "kvgate/L"
	memoSaltDomain = 0x6b76676174652f53 // "kvgate/S"
)

// NewChainMemo returns an empty memo for chain c holding at most maxBytes (rounded down to a
// power-of-two number of slot sets; DefaultChainMemoBytes is a sensible value). The table is
// allocated now; the OS commits its pages as entries fill them.
func NewChainMemo(c Chain, maxBytes int64) (*ChainMemo, error) {
	if c == nil {
		return nil, errors.New("hashcore: chain memo without a chain")
	}
	if maxBytes < MinChainMemoBytes {
		return nil, fmt.Errorf("hashcore: chain memo bound of %d bytes: must be at least %d", maxBytes, MinChainMemoBytes)
	}
	sets := uint64(1) << (63 - bits.LeadingZeros64(uint64(maxBytes/((chainSlotBytes+8)*chainMemoWays))))
	return &ChainMemo{chain: c, blockSize: c.BlockSize(), sets: sets, maxBytes: maxBytes,
		slots: make([]chainSlot, sets*chainMemoWays), tags: make([]atomic.Uint64, sets*chainMemoWays)}, nil
}

// Chain returns the contract the memo serves.
func (m *ChainMemo) Chain() Chain { return m.chain }

// ChainMemoStats are a memo's counters since it was made, in blocks.
type ChainMemoStats struct {
	Hits, Misses uint64 // blocks whose key came from the memo / from the contract's hash
	Inserts      uint64 // entries (stretches of memoStretch blocks) written
	Evictions    uint64 // entries of another prefix overwritten (set full)
	Entries      int64  // held now
	Bytes        int64  // Entries' share of the table
	TableBytes   int64  // the table, allocated at NewChainMemo, at most MaxBytes
	MaxBytes     int64
}

// Stats reads the counters (plain atomics).
func (m *ChainMemo) Stats() ChainMemoStats {
	n := m.entries.Load()
	return ChainMemoStats{Hits: m.hits.Load(), Misses: m.misses.Load(), Inserts: m.inserts.Load(),
		Evictions: m.evictions.Load(), Entries: n, Bytes: n * chainSlotBytes,
		TableBytes: int64(len(m.slots)) * (chainSlotBytes + 8), MaxBytes: m.maxBytes}
}

// memoID is a prefix's identity.
type memoID struct{ hi, lo uint64 }

// AppendKeys appends the key of every full block of a whole prompt to dst, as
// Keys(m.Chain(), dst, tokens, ex) does, taking the keys of known prefixes from the memo and
// storing the rest.
func (m *ChainMemo) AppendKeys(dst []uint64, tokens []uint32, ex *Extras) []uint64 {
	dst, _ = m.AppendKeysHit(dst, tokens, ex)
	return dst
}

// AppendKeysHit is AppendKeys that also says how many of the blocks came from the memo.
func (m *ChainMemo) AppendKeysHit(dst []uint64, tokens []uint32, ex *Extras) ([]uint64, int) {
	bs := m.blockSize
	nb := len(tokens) / bs
	if nb == 0 {
		return dst, 0
	}
	if ValidateExtras(ex) != nil { // whatever the contract does with them, unmemoized
		return Keys(m.chain, dst, tokens, ex), 0
	}
	var mix, salt uint64
	if ex != nil {
		if ex.LoRAName != "" {
			mix = xxh3.HashStringSeed(ex.LoRAName, memoLoRADomain)
		}
		if ex.CacheSalt != "" {
			salt = xxh3.HashStringSeed(ex.CacheSalt, memoSaltDomain)
		}
	}
	dst = slices.Grow(dst, nb)
	ns := nb / memoStretch
	stretchTokens := memoStretch * bs
	var sc *scratch
	if !littleEndian {
		sc = getScratch()
	}

	// The known stretches, memoBatch at a time: their identities (a chain over the tokens
	// alone), their sets' tags loaded together, then the lookups in order.
	id := memoID{hi: memoRootHi}
	parent := m.chain.Root()
	s := 0
	var next memoID
	var ids [memoBatch]memoID
	var tags [memoBatch][chainMemoWays]uint64
walk:
	for s < ns {
		n := min(memoBatch, ns-s)
		for j, prev := 0, id; j < n; j++ {
			prev = m.nextID(prev, tokens[(s+j)*stretchTokens:(s+j+1)*stretchTokens], mix, salt, s+j == 0, sc)
			ids[j] = prev
		}
		for j := range n {
			t := m.setTags(ids[j])
			tags[j] = [chainMemoWays]uint64{t[0].Load(), t[1].Load(), t[2].Load(), t[3].Load()}
		}
		for j := range n {
			next = ids[j]
			var ok bool
			if dst, ok = m.lookup(dst, next, &tags[j], &parent); !ok {
				break walk
			}
			id = next
			s++
		}
	}
	hit := s * memoStretch
	// The rest: each full stretch hashed and stored, then the blocks after the last one.
	for ; s < ns; s++ {
		if s > hit/memoStretch { // the first missing stretch's identity is already known
			next = m.nextID(id, tokens[s*stretchTokens:(s+1)*stretchTokens], mix, salt, s == 0, sc)
		}
		n := len(dst)
		dst, parent = m.chain.AppendKeys(dst, parent, tokens[s*stretchTokens:(s+1)*stretchTokens], ex, s == 0)
		if len(dst) != n+memoStretch { // the contract refused the blocks
			break
		}
		m.store(next, dst[n:], &parent)
		id = next
	}
	if s == ns && nb > ns*memoStretch {
		dst, _ = m.chain.AppendKeys(dst, parent, tokens[ns*stretchTokens:nb*bs], ex, ns == 0)
	}
	if sc != nil {
		putScratch(sc)
	}
	m.hits.Add(uint64(hit))
	m.misses.Add(uint64(nb - hit))
	return dst, hit
}

// nextID is the identity of the prefix that ends with the stretch of tokens, after the
// prefix id.
func (m *ChainMemo) nextID(id memoID, tokens []uint32, mix, salt uint64, first bool, sc *scratch) memoID {
	var msg []byte
	if littleEndian {
		msg = unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))
	} else {
		sc.buf = appendUint32sLE(sc.buf[:0], tokens)
		msg = sc.buf
	}
	seed := id.lo ^ mix
	if first {
		seed ^= salt // the cache salt enters block 0 only
	}
	out := xxh3.Hash128Seed(msg, seed)
	return memoID{hi: id.hi ^ out.Hi, lo: out.Lo}
}

func (m *ChainMemo) set(id memoID) []chainSlot {
	i := (id.lo & (m.sets - 1)) * chainMemoWays
	return m.slots[i : i+chainMemoWays : i+chainMemoWays]
}

// setTags is the tags of id's set.
func (m *ChainMemo) setTags(id memoID) []atomic.Uint64 {
	i := (id.lo & (m.sets - 1)) * chainMemoWays
	return m.tags[i : i+chainMemoWays : i+chainMemoWays]
}

// memoBatch is how many stretches a walk looks up at a time.
const memoBatch = 8

// lookup appends the keys of the stretch ending prefix id to dst and sets *d to the digest
// after it, when the memo holds them; tags are the set's tags, loaded by the caller. A way
// whose tag differs is not read (a tag stored late only costs a miss; a stale one is
// caught by the slot's own identity).
func (m *ChainMemo) lookup(dst []uint64, id memoID, tags *[chainMemoWays]uint64, d *Digest) ([]uint64, bool) {
	set := m.set(id)
	for i := range set {
		if tags[i] != id.lo {
			continue
		}
		s := &set[i]
		seq := s.seq.Load()
		if seq == 0 || seq&seqWriting != 0 || s.lo.Load() != id.lo || s.hi.Load() != id.hi {
			continue
		}
		var keys [memoStretch]uint64
		for k := range keys {
			keys[k] = s.keys[k].Load()
		}
		var w [4]uint64
		for k := range w {
			w[k] = s.digest[k].Load()
		}
		if s.seq.Load() != seq { // rewritten while read
			continue
		}
		for k := range w {
			binary.LittleEndian.PutUint64(d.B[8*k:], w[k])
		}
		d.N = uint8(seq >> seqLenShift & 63)
		return append(dst, keys[:]...), true
	}
	return dst, false
}

// store writes the entry of prefix id: its last stretch's keys and the digest after it. A
// slot another writer holds is skipped.
func (m *ChainMemo) store(id memoID, keys []uint64, d *Digest) {
	set := m.set(id)
	victim := -1
	for i := range set {
		seq := set[i].seq.Load()
		if seq == 0 {
			if victim < 0 {
				victim = i
			}
			continue
		}
		if set[i].lo.Load() == id.lo && set[i].hi.Load() == id.hi {
			return // another request stored it meanwhile
		}
	}
	if victim < 0 {
		victim = int(rand.Uint32() % chainMemoWays)
	}
	s := &set[victim]
	seq := s.seq.Load()
	if seq&seqWriting != 0 || !s.seq.CompareAndSwap(seq, seq|seqWriting) {
		return
	}
	if seq == 0 {
		m.entries.Add(1)
	} else {
		m.evictions.Add(1)
	}
	s.hi.Store(id.hi)
	s.lo.Store(id.lo)
	for k := range s.keys {
		s.keys[k].Store(keys[k])
	}
	for k := range s.digest {
		s.digest[k].Store(binary.LittleEndian.Uint64(d.B[8*k:]))
	}
	s.seq.Store((seq>>8+1)<<8 | uint64(d.N)<<seqLenShift)
	m.setTags(id)[victim].Store(id.lo)
	m.inserts.Add(1)
}
