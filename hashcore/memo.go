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
// recall them. The memo names a prefix by two independent 64-bit chains over its tokens: F,
// kvgate's fast chain (NewFast: key(i) = XXH3-64(block i, seed key(i-1) ^ extras mix)), and G,
// the same construction with other seeds. Both mix the LoRA name into every block and the
// cache salt into block 0, so prompts with different extras never share an entry. A wrong
// hit needs both 64-bit chains to collide at once: about entries/2^128 per lookup.
//
// Each entry holds a block's key; every memoCheckpoint-th block (counted from block 0) and
// the last full block of each prompt also hold the full digest the chain continues from. A
// lookup walks the prompt's blocks from 0 while they hit, then resumes the contract's chain
// from the last digest it passed (at most memoCheckpoint-1 blocks back).
//
// Entries live in a fixed table of 64-byte slots, sized from the byte bound when the memo is
// made and never grown: a prefix's F picks a set of chainMemoWays slots. Readers take no
// lock: each slot is a seqlock of atomic words (an odd sequence while written, re-checked
// after the read). Writers claim a slot with a compare-and-swap and skip it when another
// writer holds it; a full set evicts a random way. Nothing allocates after warm-up.
type ChainMemo struct {
	chain     Chain
	blockSize int
	slots     []chainSlot
	sets      uint64 // a power of two
	maxBytes  int64

	entries                          atomic.Int64
	hits, misses, inserts, evictions atomic.Uint64
}

// chainSlot is one entry; its words are atomics so that the seqlock is race-free.
type chainSlot struct {
	// seq: 0 empty; bit 0 set while a writer fills the slot; bit 1 the slot holds a digest;
	// bits 2-7 the digest's length; bits 8+ a version that every write bumps.
	seq    atomic.Uint64
	f, g   atomic.Uint64    // the prefix's identity
	key    atomic.Uint64    // the contract's key for the prefix's last block
	digest [4]atomic.Uint64 // the digest's bytes, 8 per word, little-endian
}

const (
	// DefaultChainMemoBytes is the suggested bound: 512Ki blocks, e.g. ~1,800 conversations
	// of ~4.7k tokens at 16 tokens per block.
	DefaultChainMemoBytes = 32 << 20
	// MinChainMemoBytes is the smallest bound NewChainMemo accepts.
	MinChainMemoBytes = 64 << 10

	chainSlotBytes = int64(unsafe.Sizeof(chainSlot{}))
	chainMemoWays  = 4
	// memoCheckpoint: every this many blocks an entry keeps the full digest. A prompt
	// diverging from a known one inside a stretch re-hashes at most this many - 1 blocks
	// before the divergence; each stretch is one AppendKeys call.
	memoCheckpoint = 8

	seqWriting    = 1
	seqHasDigest  = 2
	seqLenShift   = 2
	seqVersionInc = 1 << 8

	// G's seeds, apart from F's (fastLoRADomain, fastSaltDomain and a zero root).
	memoGRoot       = 0x6b76676174652f67 // "kvgate/g"
	memoGLoRADomain = 0x6b76676174652f4c // "kvgate/L"
	memoGSaltDomain = 0x6b76676174652f53 // "kvgate/S"
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
	sets := uint64(1) << (63 - bits.LeadingZeros64(uint64(maxBytes/(chainSlotBytes*chainMemoWays))))
	return &ChainMemo{chain: c, blockSize: c.BlockSize(), sets: sets, maxBytes: maxBytes,
		slots: make([]chainSlot, sets*chainMemoWays)}, nil
}

// Chain returns the contract the memo serves.
func (m *ChainMemo) Chain() Chain { return m.chain }

// ChainMemoStats are a memo's counters since it was made, in blocks.
type ChainMemoStats struct {
	Hits, Misses uint64 // blocks whose key came from the memo / from the contract's hash
	Inserts      uint64 // entries written
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
		TableBytes: int64(len(m.slots)) * chainSlotBytes, MaxBytes: m.maxBytes}
}

// AppendKeys appends the key of every full block of a whole prompt to dst, as
// Keys(m.Chain(), dst, tokens, ex) does, taking the keys of known prefixes from the memo and
// storing the rest.
func (m *ChainMemo) AppendKeys(dst []uint64, tokens []uint32, ex *Extras) []uint64 {
	bs := m.blockSize
	nb := len(tokens) / bs
	if nb == 0 {
		return dst
	}
	if ValidateExtras(ex) != nil { // whatever the contract does with them, unmemoized
		return Keys(m.chain, dst, tokens, ex)
	}
	sc := getMemoScratch()
	f, g := m.identities(sc, tokens[:nb*bs], ex)
	base := len(dst)
	dst = slices.Grow(dst, nb)

	// The known prefix, and the last digest in it.
	var parent, d Digest
	ck := -1
	h := 0
	for ; h < nb; h++ {
		d.N = 0
		key, ok := m.lookup(f[h], g[h], &d)
		if !ok {
			break
		}
		if d.N != 0 {
			parent, ck = d, h
		}
		dst = append(dst, key)
	}
	m.hits.Add(uint64(h))
	if h == nb {
		putMemoScratch(sc)
		return dst
	}
	m.misses.Add(uint64(nb - h))
	if ck < 0 {
		parent = m.chain.Root()
	}
	dst = dst[:base+ck+1]
	for i := ck + 1; i < nb; {
		end := min(nb, (i/memoCheckpoint+1)*memoCheckpoint)
		dst, parent = m.chain.AppendKeys(dst, parent, tokens[i*bs:end*bs], ex, i == 0)
		if len(dst) != base+end { // the contract refused the blocks: store nothing
			break
		}
		for j := max(i, h); j < end-1; j++ {
			m.store(f[j], g[j], dst[base+j], nil)
		}
		m.store(f[end-1], g[end-1], dst[base+end-1], &parent)
		i = end
	}
	putMemoScratch(sc)
	return dst
}

// identities computes the F and G chains of the blocks of tokens (a whole number of blocks).
func (m *ChainMemo) identities(sc *memoScratch, tokens []uint32, ex *Extras) (f, g []uint64) {
	bs := m.blockSize
	nb := len(tokens) / bs
	var fMix, fSalt, gMix, gSalt uint64
	if ex != nil {
		if ex.LoRAName != "" {
			fMix = xxh3.HashStringSeed(ex.LoRAName, fastLoRADomain)
			gMix = xxh3.HashStringSeed(ex.LoRAName, memoGLoRADomain)
		}
		if ex.CacheSalt != "" {
			fSalt = xxh3.HashStringSeed(ex.CacheSalt, fastSaltDomain)
			gSalt = xxh3.HashStringSeed(ex.CacheSalt, memoGSaltDomain)
		}
	}
	f = slices.Grow(sc.f[:0], nb)[:nb]
	g = slices.Grow(sc.g[:0], nb)[:nb]
	var fk uint64
	gk := uint64(memoGRoot)
	for i := 0; i < nb; i++ {
		var msg []byte
		if littleEndian {
			msg = unsafe.Slice((*byte)(unsafe.Pointer(&tokens[i*bs])), 4*bs)
		} else {
			sc.buf = appendUint32sLE(sc.buf[:0], tokens[i*bs:(i+1)*bs])
			msg = sc.buf
		}
		fk = xxh3.HashSeed(msg, fk^fMix^fSalt)
		gk = xxh3.HashSeed(msg, gk^gMix^gSalt)
		fSalt, gSalt = 0, 0 // the cache salt enters block 0 only
		f[i], g[i] = fk, gk
	}
	sc.f, sc.g = f, g
	return f, g
}

func (m *ChainMemo) set(f uint64) []chainSlot {
	i := (f & (m.sets - 1)) * chainMemoWays
	return m.slots[i : i+chainMemoWays : i+chainMemoWays]
}

// lookup returns the key of prefix (f, g) and, when the entry holds one, sets *d to its
// digest (d.N stays as it was otherwise).
func (m *ChainMemo) lookup(f, g uint64, d *Digest) (uint64, bool) {
	set := m.set(f)
	for i := range set {
		s := &set[i]
		seq := s.seq.Load()
		if seq == 0 || seq&seqWriting != 0 || s.f.Load() != f || s.g.Load() != g {
			continue
		}
		key := s.key.Load()
		var w [4]uint64
		if seq&seqHasDigest != 0 {
			for k := range w {
				w[k] = s.digest[k].Load()
			}
		}
		if s.seq.Load() != seq { // rewritten while read
			continue
		}
		if seq&seqHasDigest != 0 {
			for k := range w {
				binary.LittleEndian.PutUint64(d.B[8*k:], w[k])
			}
			d.N = uint8(seq >> seqLenShift & 63)
		}
		return key, true
	}
	return 0, false
}

// store writes the entry of prefix (f, g); d, when not nil, is the digest to keep with it.
// An entry already holding a digest keeps it. A slot another writer holds is skipped.
func (m *ChainMemo) store(f, g, key uint64, d *Digest) {
	set := m.set(f)
	victim := -1
	for i := range set {
		seq := set[i].seq.Load()
		if seq == 0 {
			if victim < 0 {
				victim = i
			}
			continue
		}
		if set[i].f.Load() == f && set[i].g.Load() == g {
			if d == nil || seq&seqHasDigest != 0 {
				return
			}
			victim = i // add the digest
			break
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
	} else if s.f.Load() != f || s.g.Load() != g {
		m.evictions.Add(1)
	}
	s.f.Store(f)
	s.g.Store(g)
	s.key.Store(key)
	next := (seq>>8 + 1) << 8
	if d != nil {
		for k := range s.digest {
			s.digest[k].Store(binary.LittleEndian.Uint64(d.B[8*k:]))
		}
		next |= seqHasDigest | uint64(d.N)<<seqLenShift
	}
	s.seq.Store(next)
	m.inserts.Add(1)
}

// memoScratch holds one call's F and G chains.
type memoScratch struct {
	f, g []uint64
	buf  []byte // big-endian hosts: a block's little-endian bytes
}

// memoScratchSlots is a lock-free free list like scratchSlots (which see).
var memoScratchSlots [32]atomic.Pointer[memoScratch]

// maxPooledMemo bounds the chains a pooled scratch keeps (blocks).
const maxPooledMemo = 32 << 10

func getMemoScratch() *memoScratch {
	for i := range memoScratchSlots {
		if memoScratchSlots[i].Load() != nil {
			if s := memoScratchSlots[i].Swap(nil); s != nil {
				return s
			}
		}
	}
	return &memoScratch{}
}

func putMemoScratch(s *memoScratch) {
	if cap(s.f) > maxPooledMemo {
		return
	}
	for i := range memoScratchSlots {
		if memoScratchSlots[i].Load() == nil && memoScratchSlots[i].CompareAndSwap(nil, s) {
			return
		}
	}
}
