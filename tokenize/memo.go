package tokenize

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// Memo remembers the IDs of text segments between added tokens, so that a follow-up turn of a
// chat, which re-sends every earlier turn, costs what its new text costs.
//
// Why it is exact by construction: HF tokenizers (AddedVocabulary::extract_and_normalize)
// split the raw text on the non-normalized added tokens before anything else, then normalize,
// pre-tokenize and run the model on each piece on its own; appendEncode does the same. A
// piece's IDs are therefore a function of the tokenizer, the piece's bytes and whether it
// starts the text (Metaspace's prepend_scheme "first"), and of nothing else. The memo's key is
// exactly that triple, checked in full on every hit (the tokenizer's memoSalt, unique to it,
// the flag, and the segment's bytes compared with the stored copy), so a hash collision can
// only cost a miss, never change a token. Where the split points fall (single_word, lstrip,
// rstrip look at the neighbours) is still computed on the whole text every time; only what
// lies between is memoized. The post-processor's special tokens are added outside the
// segments. A text holding no added token at all (a plain completions prompt) bypasses the
// memo: as one segment it could serve only an exact repeat.
//
// A Memo is bounded in bytes (its ring plus its slot table), safe for concurrent use and
// shared by any number of tokenizers. Entries live in a ring of 64-bit words, allocated page
// by page as the memo first fills and then reused, so that an insert in steady state
// allocates nothing: an entry is a header (salt; text length, ID count and flag; its slot),
// its text and its IDs, written at the ring's head at a logical word position that only
// grows. Lookups take no lock: a segment's hash picks a set of memoWays slots, each holding
// 1 + the position of its entry (and CLOCK's referenced bit). Inserts (on a miss, after the
// segment was encoded, which costs far more) take one mutex, which also serializes the ring's
// head and tail and the byte accounting.
//
// Eviction is CLOCK over the ring: to make room at the head, the tail passes the oldest
// entries; one hit since it last passed (its slot's referenced bit) is copied to the head
// with the bit cleared, one not hit is dropped, and space whose slot moved on (the entry lost
// its way to a newer one of its set) is simply reused.
//
// Why a reader never serves a reused word: every word of the ring is read and written with
// sync/atomic (so the race detector sees no race, and Go's atomics are sequentially
// consistent). Before the writer reuses the words of positions [p, p+n) it stores into low a
// tail past p+n, and low only grows. A reader loads its slot (so it sees the entry's words,
// stored before the slot), loads the entry's words, then loads low: if low is still at most
// the entry's position, that load came before the writer's store of a larger low, which came
// before any store reusing the entry's words, so every word the reader loaded was the
// entry's. Otherwise the reader drops what it read and misses. Positions never wrap (63 bits
// of words), so a recycled word cannot pass for the old one. What a reader loads from a
// reused entry is bounded (the text length must be the segment's, the ID count the largest
// an entry may hold), so a stale read costs at most one entry's worth of work.
type Memo struct {
	seed  uint64          // per memo, so that no fixed input crowds a set
	slots []atomic.Uint64 // 0, or memoRef | (1 + the ring position of the way's entry)
	sets  uint64          // a power of two

	pages     []atomic.Pointer[memoPage] // the ring, allocated page by page as it first fills
	pageShift uint                       // a page holds 1<<pageShift words
	ringWords uint64                     // len(pages) << pageShift
	low       atomic.Uint64              // the tail, published before its words are reused

	maxBytes   int64
	tableBytes int64 // the slot table and the page table, counted against maxBytes
	maxIDs     int   // the most IDs an entry may hold (bounds what a stale read loads)

	mu         sync.Mutex // serializes writers of slots, pages, head, tail and the byte counts
	head, tail uint64     // ring positions: entries live in [tail, head), tail <= head <= tail+ringWords
	pageBytes  atomic.Int64
	liveBytes  atomic.Int64 // the words of entries their slot still points to

	hits, misses, inserts, evictions, notes atomic.Uint64
}

type memoPage struct{ w []atomic.Uint64 }

const (
	// DefaultMemoBytes is the suggested bound of a Memo (a ~4.7k-token conversation takes
	// about 40 KiB: its text plus 4 bytes per token).
	DefaultMemoBytes = 64 << 20
	// MinMemoBytes is the smallest bound NewMemo accepts.
	MinMemoBytes = 64 << 10

	memoWays = 4
	// memoMinSegment: shorter segments ("\n", "assistant\n" between special tokens) are encoded
	// directly; through the word cache they cost less than a memo lookup would save.
	memoMinSegment = 32
	// memoBytesPerSlot sizes the slot table: one slot per this many bytes of bound.
	memoBytesPerSlot = 1024
	// memoHeaderWords: the tokenizer's salt; text length<<32 | ID count<<1 | first; the slot.
	memoHeaderWords = 3
	// A page is a 64th of the bound, within these (a power of two).
	memoMinPageBytes, memoMaxPageBytes = 4 << 10, 1 << 20

	memoRef     = 1 << 63 // a slot's CLOCK referenced bit: set on a hit, cleared by the tail
	memoPosMask = memoRef - 1
)

// NewMemo returns an empty memo holding at most maxBytes (DefaultMemoBytes is a sensible
// value; at least MinMemoBytes).
func NewMemo(maxBytes int64) (*Memo, error) {
	if maxBytes < MinMemoBytes {
		return nil, fmt.Errorf("tokenize: memo bound of %d bytes: must be at least %d", maxBytes, MinMemoBytes)
	}
	sets := uint64(1) << (63 - bits.LeadingZeros64(uint64(maxBytes/(memoBytesPerSlot*memoWays))))
	sets = min(sets, 1<<20)
	pageBytes := int64(1) << (63 - bits.LeadingZeros64(uint64(maxBytes/64)))
	pageBytes = min(max(pageBytes, memoMinPageBytes), memoMaxPageBytes)
	m := &Memo{seed: rand.Uint64(), sets: sets, maxBytes: maxBytes, pageShift: uint(bits.TrailingZeros64(uint64(pageBytes / 8)))}
	m.slots = make([]atomic.Uint64, sets*memoWays)
	npages := (maxBytes - int64(len(m.slots))*8) / (pageBytes + 8)
	m.pages = make([]atomic.Pointer[memoPage], npages)
	m.ringWords = uint64(npages) << m.pageShift
	m.tableBytes = int64(len(m.slots))*8 + npages*8
	m.maxIDs = int(min(maxBytes/8/4, math.MaxInt32))
	return m, nil
}

// MemoStats are a memo's counters since it was made (segments, not requests).
type MemoStats struct {
	Hits, Misses uint64 // segment lookups that found their IDs / encoded the segment
	// Notes: replayed chat iterations whose IDs came whole from their token note (their
	// segments count in Hits; notes.go).
	Notes     uint64
	Inserts   uint64 // segments stored
	Evictions uint64 // entries dropped to make room (ring full or set full)
	// Bytes is held now: the slot table and the ring's pages (allocated as the memo first
	// fills, then reused), at most MaxBytes. Live is the part live entries take; the rest
	// is free, or dropped entries' space the ring's tail has yet to pass.
	Bytes, Live int64
	MaxBytes    int64
}

// Stats reads the counters (plain atomics, cheap enough to scrape on every metrics read).
func (m *Memo) Stats() MemoStats {
	return MemoStats{Hits: m.hits.Load(), Misses: m.misses.Load(), Notes: m.notes.Load(), Inserts: m.inserts.Load(),
		Evictions: m.evictions.Load(), Bytes: m.tableBytes + m.pageBytes.Load(), Live: m.liveBytes.Load(), MaxBytes: m.maxBytes}
}

// set returns the index of the first slot of seg's set. The hash only picks the set (a hit
// compares the stored text in full); xxh3 (AVX2 / AVX-512 where present) hashes a long
// segment 2.5x faster than hash/maphash, and every earlier turn is hashed on each follow-up.
func (m *Memo) set(t *Tokenizer, seg string, first bool) uint64 {
	h := xxh3.HashStringSeed(seg, m.seed) ^ t.memoSalt
	if first {
		h ^= 0x9e3779b97f4a7c15
	}
	h ^= h >> 29 // the salt may sit in the high bits
	return (h & (m.sets - 1)) * memoWays
}

// span returns the ring's words from position pos on: at most n, and at most to the end of
// pos's page; nil when that page was never allocated (only a stale read asks for one).
func (m *Memo) span(pos uint64, n int) []atomic.Uint64 {
	p := m.pages[(pos>>m.pageShift)%uint64(len(m.pages))].Load()
	if p == nil {
		return nil
	}
	off := pos & (1<<m.pageShift - 1)
	return p.w[off:min(off+uint64(n), uint64(len(p.w)))]
}

func memoMeta(textLen, nIDs int, first bool) uint64 {
	meta := uint64(textLen)<<32 | uint64(nIDs)<<1
	if first {
		meta |= 1
	}
	return meta
}

// memoEntryWords is the ring space of an entry with header word meta.
func memoEntryWords(meta uint64) uint64 {
	return memoHeaderWords + (meta>>32+7)/8 + (uint64(uint32(meta)>>1)+1)/2
}

// match reports whether the entry at pos is the key's, and its ID count. Under a writer's
// lock it is exact; a reader must still check low afterwards.
func (m *Memo) match(pos uint64, salt uint64, seg string, first bool) (int, bool) {
	if w, ok := m.load(pos); !ok || w != salt {
		return 0, false
	}
	meta, ok := m.load(pos + 1) // a header may straddle two pages
	if !ok || meta>>32 != uint64(len(seg)) || meta&1 != memoMeta(0, 0, first) {
		return 0, false
	}
	nIDs := int(uint32(meta) >> 1)
	if nIDs > m.maxIDs {
		return 0, false
	}
	pos += memoHeaderWords
	for len(seg) > 0 {
		ws := m.span(pos, (len(seg)+7)/8)
		if ws == nil {
			return 0, false
		}
		pos += uint64(len(ws))
		full := min(len(ws), len(seg)/8)
		if !memoWordsEqual(ws[:full], seg[:8*full]) {
			return 0, false
		}
		if seg = seg[8*full:]; full < len(ws) { // the text's last word, zero-padded
			if ws[full].Load() != memoTextWord(seg) {
				return 0, false
			}
			seg = ""
		}
	}
	return nIDs, true
}

// memoWordsEqual reports whether the words ws hold text (8 bytes a word, little-endian),
// four words a step with one branch: the hit path's compare runs over every earlier turn.
func memoWordsEqual(ws []atomic.Uint64, text string) bool {
	text = text[:8*len(ws)]
	for len(ws) >= 4 {
		w, t := ws[:4:4], text[:32]
		if (w[0].Load()^memoLE64(t))|(w[1].Load()^memoLE64(t[8:]))|
			(w[2].Load()^memoLE64(t[16:]))|(w[3].Load()^memoLE64(t[24:])) != 0 {
			return false
		}
		ws, text = ws[4:], text[32:]
	}
	for i := range ws {
		if ws[i].Load() != memoLE64(text[8*i:]) {
			return false
		}
	}
	return true
}

// memoUnpackIDs stores the ID pairs of ws (two a word, the first in the low half) into out
// (2*len(ws) IDs).
func memoUnpackIDs(out []uint32, ws []atomic.Uint64) {
	out = out[:2*len(ws)]
	for len(ws) >= 4 {
		w, o := ws[:4:4], out[:8:8]
		x0, x1, x2, x3 := w[0].Load(), w[1].Load(), w[2].Load(), w[3].Load()
		o[0], o[1], o[2], o[3] = uint32(x0), uint32(x0>>32), uint32(x1), uint32(x1>>32)
		o[4], o[5], o[6], o[7] = uint32(x2), uint32(x2>>32), uint32(x3), uint32(x3>>32)
		ws, out = ws[4:], out[8:]
	}
	for i := range ws {
		x := ws[i].Load()
		p := out[2*i : 2*i+2 : 2*i+2]
		p[0], p[1] = uint32(x), uint32(x>>32)
	}
}

// memoLE64 is the first 8 bytes of s (at least 8), little-endian: one load.
func memoLE64(s string) uint64 {
	s = s[:8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// memoTextWord is the next (up to) 8 bytes of s, little-endian, zero-padded.
func memoTextWord(s string) uint64 {
	if len(s) >= 8 {
		return memoLE64(s)
	}
	var x uint64
	for i := len(s) - 1; i >= 0; i-- {
		x = x<<8 | uint64(s[i])
	}
	return x
}

// get appends the memoized IDs of seg to dst.
func (m *Memo) get(dst []uint32, t *Tokenizer, seg string, first bool) ([]uint32, bool) {
	set := m.set(t, seg, first)
	for i := set; i < set+memoWays; i++ {
		v := m.slots[i].Load()
		if v == 0 {
			continue
		}
		if d, ok := m.read(dst, v&memoPosMask-1, t.memoSalt, seg, first); ok {
			if v&memoRef == 0 { // a store only once per pass of the tail: hot slots stay shared in caches
				m.slots[i].CompareAndSwap(v, v|memoRef)
			}
			return d, true
		}
	}
	return dst, false
}

// read appends the IDs of the entry at pos if it is the key's and was not reused meanwhile.
func (m *Memo) read(dst []uint32, pos uint64, salt uint64, seg string, first bool) ([]uint32, bool) {
	nIDs, ok := m.match(pos, salt, seg, first)
	if !ok {
		return dst, false
	}
	n := len(dst)
	dst = slices.Grow(dst, nIDs)
	out := dst[n : n+nIDs]
	at := pos + memoHeaderWords + (uint64(len(seg))+7)/8
	for k := 0; k < nIDs; {
		ws := m.span(at, (nIDs-k+1)/2)
		if ws == nil {
			return dst[:n], false
		}
		at += uint64(len(ws))
		pairs := out[k:min(k+2*len(ws), nIDs)]
		memoUnpackIDs(pairs, ws[:len(pairs)/2])
		if len(pairs)%2 == 1 { // the last ID, alone in its word
			pairs[len(pairs)-1] = uint32(ws[len(ws)-1].Load())
		}
		k += len(pairs)
	}
	if m.low.Load() > pos { // the tail passed the entry: its words may be another's (see Memo)
		return dst[:n], false
	}
	return dst[:n+nIDs], true
}

// ringCursor stores or loads consecutive ring words (writers only, under mu).
type ringCursor struct {
	m   *Memo
	pos uint64
	ws  []atomic.Uint64
}

func (c *ringCursor) next() *atomic.Uint64 {
	if len(c.ws) == 0 {
		c.ws = c.m.writable(c.pos)
	}
	w := &c.ws[0]
	c.ws = c.ws[1:]
	c.pos++
	return w
}

// writable returns the rest of pos's page, allocating the page on the ring's first turn.
func (m *Memo) writable(pos uint64) []atomic.Uint64 {
	pi := (pos >> m.pageShift) % uint64(len(m.pages))
	p := m.pages[pi].Load()
	if p == nil {
		p = &memoPage{w: make([]atomic.Uint64, 1<<m.pageShift)}
		m.pages[pi].Store(p)
		m.pageBytes.Add(8 << m.pageShift)
	}
	return p.w[pos&(1<<m.pageShift-1):]
}

// load reads the word at pos (false: its page was never allocated, a stale read).
func (m *Memo) load(pos uint64) (uint64, bool) {
	if ws := m.span(pos, 1); ws != nil {
		return ws[0].Load(), true
	}
	return 0, false
}

// word reads the word at pos of an entry in [tail, head) (writers only, under mu).
func (m *Memo) word(pos uint64) uint64 { return m.span(pos, 1)[0].Load() }

// put stores the IDs of seg. Segments over an eighth of the bound are not kept: one would
// flush the memo of everything else.
func (m *Memo) put(t *Tokenizer, seg string, first bool, ids []uint32) {
	words := uint64(memoHeaderWords + (len(seg)+7)/8 + (len(ids)+1)/2)
	if int64(words)*8 > m.maxBytes/8 || len(seg) > math.MaxUint32 || len(ids) > m.maxIDs {
		return
	}
	set := m.set(t, seg, first)
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := set; i < set+memoWays; i++ {
		if v := m.slots[i].Load(); v != 0 {
			if _, ok := m.match(v&memoPosMask-1, t.memoSalt, seg, first); ok {
				return // another request stored it meanwhile
			}
		}
	}
	m.reserve(words)
	victim := -1
	for i := set; i < set+memoWays; i++ {
		v := m.slots[i].Load()
		if v == 0 {
			victim = int(i)
			break
		}
		if victim < 0 && v&memoRef == 0 {
			victim = int(i)
		}
	}
	if victim < 0 { // every way was hit since the tail last passed: a random one goes
		victim = int(set) + int(rand.Uint32()%memoWays)
	}
	pos := m.head
	c := ringCursor{m: m, pos: pos}
	c.next().Store(t.memoSalt)
	c.next().Store(memoMeta(len(seg), len(ids), first))
	c.next().Store(uint64(victim))
	for s := seg; len(s) > 0; s = s[min(8, len(s)):] {
		c.next().Store(memoTextWord(s))
	}
	for i := 0; i < len(ids); i += 2 {
		x := uint64(ids[i])
		if i+1 < len(ids) {
			x |= uint64(ids[i+1]) << 32
		}
		c.next().Store(x)
	}
	m.head += words
	if old := m.slots[victim].Swap(pos + 1); old != 0 {
		oldPos := old&memoPosMask - 1
		m.liveBytes.Add(-8 * int64(memoEntryWords(m.word(oldPos+1))))
		m.evictions.Add(1)
	}
	m.liveBytes.Add(8 * int64(words))
	m.inserts.Add(1)
}

// reserve advances the ring's tail until n words are free at its head (CLOCK: see Memo).
// Moving a referenced entry frees nothing, so past a turn's worth of moves the tail drops
// entries whatever their bit: the sweep ends even while readers keep setting bits.
func (m *Memo) reserve(n uint64) {
	var moved uint64
	for m.tail+m.ringWords-m.head < n {
		at := m.tail
		meta := m.word(at + 1)
		size := memoEntryWords(meta)
		slot := &m.slots[m.word(at+2)]
		v := slot.Load()
		m.tail += size
		m.low.Store(m.tail) // readers of [at, at+size) fail from here on
		if v&memoPosMask != at+1 {
			continue // the way holds a newer entry: this one is already counted out
		}
		if v&memoRef != 0 && moved < m.ringWords {
			// The head's free words, reclaimed earlier, lie just before these in the ring
			// (or are these): copying upwards word by word never overwrites one unread.
			src, dst := ringCursor{m: m, pos: at}, ringCursor{m: m, pos: m.head}
			for k := uint64(0); k < size; k++ {
				dst.next().Store(src.next().Load())
			}
			slot.Store(m.head + 1) // the bit cleared; a reader does not touch a set bit
			m.head += size
			moved += size
			continue
		}
		slot.Store(0)
		m.liveBytes.Add(-8 * int64(size))
		m.evictions.Add(1)
	}
}

// MemoUnsupported says why a Memo cannot help this tokenizer ("" when it can). EncodeMemo and
// the Model's memo variants then encode as without one; callers log the reason at load.
func (t *Tokenizer) MemoUnsupported() string {
	if t.rawTrie.empty {
		return "no added token splits raw text, so every prompt is a single segment and no follow-up repeats one"
	}
	return ""
}

// memoSalts gives each tokenizer its own hash salt, so that tokenizers sharing a memo do not
// crowd the same sets with the same text. A salt is also the tokenizer's identity in the
// memo's entries: n times an odd constant, distinct for every n below 2^64 and never 0.
var memoSalts atomic.Uint64

func nextMemoSalt() uint64 { return memoSalts.Add(1) * 0xbf58476d1ce4e5b9 }
