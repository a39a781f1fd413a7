package tokenize

import (
	"fmt"
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
)

// Memo remembers the IDs of text segments between added tokens, so that a follow-up turn of a
// chat, which re-sends every earlier turn, costs what its new text costs.
//
// Why it is exact by construction: HF tokenizers (AddedVocabulary::extract_and_normalize)
// split the raw text on the non-normalized added tokens before anything else, then normalize,
// pre-tokenize and run the model on each piece on its own; appendEncode does the same. A
// piece's IDs are therefore a function of the tokenizer, the piece's bytes and whether it
// starts the text (Metaspace's prepend_scheme "first"), and of nothing else. The memo's key is
// exactly that triple, checked in full on every hit (tokenizer pointer, the flag, and the
// segment's bytes compared with the stored copy), so a hash collision can only cost a miss,
// never change a token. Where the split points fall (single_word, lstrip, rstrip look at the
// neighbours) is still computed on the whole text every time; only what lies between is
// memoized. The post-processor's special tokens are added outside the segments. A text
// holding no added token at all (a plain completions prompt) bypasses the memo: as one
// segment it could serve only an exact repeat.
//
// A Memo is bounded in bytes (entries plus its slot table), safe for concurrent use and
// shared by any number of tokenizers. Lookups take no lock: a segment's hash picks a set of
// memoWays slots, each an atomic pointer to an immutable entry. Inserts (on a miss, after the
// segment was encoded, which costs far more) take one mutex, which also serializes the byte
// accounting and the CLOCK eviction sweep.
type Memo struct {
	seed  maphash.Seed
	slots []atomic.Pointer[memoEntry]
	sets  uint64 // a power of two

	maxBytes   int64
	tableBytes int64 // the slot table, counted against maxBytes

	mu    sync.Mutex // serializes writers of slots, bytes and hand
	hand  int        // CLOCK hand over slots
	bytes atomic.Int64

	hits, misses, inserts, evictions atomic.Uint64
}

type memoEntry struct {
	tok   *Tokenizer
	first bool
	ref   atomic.Bool // CLOCK's referenced bit: set on a hit, cleared by the sweep
	text  string
	ids   []uint32
	size  int64
}

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
	// memoEntryOverhead is what an entry costs besides its text and IDs (and their size-class
	// rounding): the struct and the rounding of small objects.
	memoEntryOverhead = 112
	// memoBytesPerSlot sizes the slot table: one slot per this many bytes of bound.
	memoBytesPerSlot = 1024
)

// NewMemo returns an empty memo holding at most maxBytes (DefaultMemoBytes is a sensible
// value; at least MinMemoBytes).
func NewMemo(maxBytes int64) (*Memo, error) {
	if maxBytes < MinMemoBytes {
		return nil, fmt.Errorf("tokenize: memo bound of %d bytes: must be at least %d", maxBytes, MinMemoBytes)
	}
	sets := uint64(1) << (63 - bits.LeadingZeros64(uint64(maxBytes/(memoBytesPerSlot*memoWays))))
	sets = min(sets, 1<<20)
	m := &Memo{seed: maphash.MakeSeed(), sets: sets, maxBytes: maxBytes}
	m.slots = make([]atomic.Pointer[memoEntry], sets*memoWays)
	m.tableBytes = int64(len(m.slots)) * 8
	return m, nil
}

// MemoStats are a memo's counters since it was made (segments, not requests).
type MemoStats struct {
	Hits, Misses uint64 // segment lookups that found their IDs / encoded the segment
	Inserts      uint64 // segments stored
	Evictions    uint64 // entries dropped to make room (bound or set full)
	Bytes        int64  // held now: entries plus the slot table, at most MaxBytes
	MaxBytes     int64
}

// Stats reads the counters (plain atomics, cheap enough to scrape on every metrics read).
func (m *Memo) Stats() MemoStats {
	return MemoStats{Hits: m.hits.Load(), Misses: m.misses.Load(), Inserts: m.inserts.Load(),
		Evictions: m.evictions.Load(), Bytes: m.tableBytes + m.bytes.Load(), MaxBytes: m.maxBytes}
}

func (m *Memo) set(t *Tokenizer, seg string, first bool) []atomic.Pointer[memoEntry] {
	h := maphash.String(m.seed, seg) ^ t.memoSalt
	if first {
		h ^= 0x9e3779b97f4a7c15
	}
	h ^= h >> 29 // the salt may sit in the high bits
	i := (h & (m.sets - 1)) * memoWays
	return m.slots[i : i+memoWays : i+memoWays]
}

// get appends the memoized IDs of seg to dst.
func (m *Memo) get(dst []uint32, t *Tokenizer, seg string, first bool) ([]uint32, bool) {
	set := m.set(t, seg, first)
	for i := range set {
		e := set[i].Load()
		if e != nil && e.tok == t && e.first == first && e.text == seg {
			if !e.ref.Load() { // a store only once per sweep: hot entries stay shared in caches
				e.ref.Store(true)
			}
			return append(dst, e.ids...), true
		}
	}
	return dst, false
}

// put stores the IDs of seg. Segments over an eighth of the bound are not kept: one would
// flush the memo of everything else.
func (m *Memo) put(t *Tokenizer, seg string, first bool, ids []uint32) {
	payload := int64(len(seg)) + 4*int64(len(ids))
	size := memoEntryOverhead + payload + payload/8 // the allocator's size classes waste up to 1/8
	if size > m.maxBytes/8 {
		return
	}
	e := &memoEntry{tok: t, first: first, text: strings.Clone(seg), ids: append([]uint32(nil), ids...), size: size}
	set := m.set(t, seg, first)
	m.mu.Lock()
	defer m.mu.Unlock()
	victim := -1
	for i := range set {
		old := set[i].Load()
		if old == nil {
			victim = i
			break
		}
		if old.tok == t && old.first == first && old.text == seg {
			return // another request stored it meanwhile
		}
		if victim < 0 && !old.ref.Load() {
			victim = i
		}
	}
	if victim < 0 { // every way was hit since the last sweep: a random one goes
		victim = int(rand.Uint32() % memoWays)
	}
	if old := set[victim].Swap(e); old != nil {
		m.bytes.Add(-old.size)
		m.evictions.Add(1)
	}
	m.inserts.Add(1)
	budget := m.maxBytes - m.tableBytes
	// CLOCK: entries hit since the hand last passed get a second chance. Two full turns clear
	// every referenced bit, so the sweep ends; the entry just stored is spared while any
	// other remains.
	for steps := 0; m.bytes.Load()+size > budget && steps < 2*len(m.slots); steps++ {
		m.hand++
		if m.hand >= len(m.slots) {
			m.hand = 0
		}
		s := &m.slots[m.hand]
		old := s.Load()
		if old == nil || old == e {
			continue
		}
		if old.ref.Load() {
			old.ref.Store(false)
			continue
		}
		s.Store(nil)
		m.bytes.Add(-old.size)
		m.evictions.Add(1)
	}
	if m.bytes.Load()+size > budget { // only possible when e alone exceeds what is left
		for i := range set {
			if set[i].CompareAndSwap(e, nil) {
				return
			}
		}
	}
	m.bytes.Add(size)
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
// crowd the same sets with the same text.
var memoSalts atomic.Uint64

func nextMemoSalt() uint64 { return memoSalts.Add(1) * 0xbf58476d1ce4e5b9 }
