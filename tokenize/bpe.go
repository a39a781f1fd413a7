package tokenize

import (
	"fmt"
	"unicode/utf8"
)

// bpeModel is an HF BPE model. Merges apply lowest rank first, ties leftmost (HF's Word::merge_all).
//
// Byte-level tokenizers (a ByteLevel pre-tokenizer) work on raw bytes: the vocabulary is keyed
// by the bytes its byte-level strings stand for, so words never go through the byte-to-char
// mapping. Other tokenizers work on UTF-8 characters with byte_fallback and unk handling.
type bpeModel struct {
	byteLevel      bool
	vocab          map[string]uint32 // raw bytes (byteLevel) or UTF-8 token strings
	merges         map[uint64]uint64 // left<<32|right -> rank<<32|newID
	byteID         [256]int64        // byteLevel: id of each byte's token, -1 if absent
	asciiID        [128]int64        // char-level: id of each ASCII char's token, -1 if absent
	fallback       [256]int64        // byte_fallback: id of <0xXX>, -1 if absent
	byteFallback   bool
	fuseUnk        bool
	unkID          int64 // -1 when no unk token
	ignoreMerges   bool
	prefix, suffix string // continuing_subword_prefix, end_of_word_suffix (char-level only)
	vocabSize      int
	vocabStrings   map[string]uint32 // load time only: the vocabulary as written in the file
	// metaChunks: char-level model whose long words may be cut before each run of '▁'
	// (see Tokenizer.encodeChunks); metaUnsafe lists the characters some token joins to a
	// following '▁', before which no cut is made.
	metaChunks bool
	metaUnsafe []rune
}

const metaChar = '\u2581'

// setupMetaChunks decides whether long words can be cut before runs of '▁'.
func (m *bpeModel) setupMetaChunks() {
	if m.byteLevel || m.prefix != "" || m.suffix != "" {
		return
	}
	if _, ok := m.vocab[string(metaChar)]; !ok {
		return
	}
	unsafe := map[rune]bool{}
	for tok := range m.vocab {
		prev := metaChar
		for _, r := range tok {
			if r == metaChar && prev != metaChar {
				unsafe[prev] = true
			}
			prev = r
		}
	}
	for r := range unsafe {
		m.metaUnsafe = append(m.metaUnsafe, r)
	}
	m.metaChunks = true
}

// metaUnsafeBefore reports whether the last character of s may join a following '▁'.
func (m *bpeModel) metaUnsafeBefore(s string) bool {
	if len(m.metaUnsafe) == 0 {
		return false
	}
	r, _ := utf8.DecodeLastRuneInString(s)
	for _, u := range m.metaUnsafe {
		if u == r {
			return true
		}
	}
	return false
}

// symbol is one node of the doubly linked list a word is merged in. rank and newID describe
// the merge of this symbol with the next one (rank noMerge: none).
type symbol struct {
	id          uint32
	prev, next  int32
	rank, newID uint32
}

const noMerge = ^uint32(0)

// bpeScratch holds the per-call buffers of one word merge.
type bpeScratch struct {
	syms []symbol
	heap []uint64 // rank<<32 | position
	str  []byte
}

func (m *bpeModel) mergeOf(a, b uint32) (rank, newID uint32, ok bool) {
	v, ok := m.merges[uint64(a)<<32|uint64(b)]
	return uint32(v >> 32), uint32(v), ok
}

// encodeWord appends the ids of word w (a pre-tokenized piece) to dst.
func (m *bpeModel) encodeWord(dst []uint32, w string, sc *bpeScratch) []uint32 {
	if len(w) == 0 {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return append(dst, id)
		}
	}
	syms := sc.syms[:0]
	if m.byteLevel {
		for i := 0; i < len(w); i++ {
			if id := m.byteID[w[i]]; id >= 0 {
				syms = append(syms, symbol{id: uint32(id)})
			}
		}
	} else {
		syms = m.charSymbols(syms, w, sc)
	}
	for i := range syms {
		syms[i].prev = int32(i - 1)
		syms[i].next = int32(i + 1)
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	syms = m.mergeAll(syms, sc)
	for i := 0; i >= 0 && i < len(syms); i = int(syms[i].next) {
		dst = append(dst, syms[i].id)
	}
	sc.syms = syms
	return dst
}

// charSymbols splits w into initial symbols as HF BPE::merge_word does: one per character,
// byte_fallback tokens for unknown characters, and (fused) unk tokens otherwise.
func (m *bpeModel) charSymbols(syms []symbol, w string, sc *bpeScratch) []symbol {
	unk := false // an unk symbol is pending (fuse_unk)
	for i := 0; i < len(w); {
		var id int64 = -1
		n := 1
		if c := w[i]; c < utf8.RuneSelf && m.prefix == "" && m.suffix == "" {
			id = m.asciiID[c]
		} else {
			_, n = utf8.DecodeRuneInString(w[i:])
			if m.prefix == "" && m.suffix == "" {
				if v, ok := m.vocab[w[i:i+n]]; ok {
					id = int64(v)
				}
			} else {
				s := sc.str[:0]
				if i > 0 {
					s = append(s, m.prefix...)
				}
				s = append(s, w[i:i+n]...)
				if i+n == len(w) {
					s = append(s, m.suffix...)
				}
				sc.str = s
				if v, ok := m.vocab[string(s)]; ok {
					id = int64(v)
				}
			}
		}
		if id >= 0 {
			if unk {
				syms = append(syms, symbol{id: uint32(m.unkID)})
				unk = false
			}
			syms = append(syms, symbol{id: uint32(id)})
			i += n
			continue
		}
		if m.byteFallback && m.fallbackCovers(w[i:i+n]) {
			for k := i; k < i+n; k++ {
				syms = append(syms, symbol{id: uint32(m.fallback[w[k]])})
			}
			i += n
			continue
		}
		if m.unkID >= 0 {
			if unk && !m.fuseUnk {
				syms = append(syms, symbol{id: uint32(m.unkID)})
			}
			unk = true
		}
		i += n
	}
	if unk {
		syms = append(syms, symbol{id: uint32(m.unkID)})
	}
	return syms
}

func (m *bpeModel) fallbackCovers(s string) bool {
	for i := 0; i < len(s); i++ {
		if m.fallback[s[i]] < 0 {
			return false
		}
	}
	return true
}

// setPair records the merge of syms[i] with its next symbol, if the merge list has one.
func (m *bpeModel) setPair(syms []symbol, i int) {
	s := &syms[i]
	s.rank = noMerge
	if s.next >= 0 {
		if r, n, ok := m.mergeOf(s.id, syms[s.next].id); ok {
			s.rank, s.newID = r, n
		}
	}
}

// mergeAt merges syms[i] with its next symbol and refreshes the pairs that changed. It
// returns the position of the previous symbol (-1 at the start).
func (m *bpeModel) mergeAt(syms []symbol, i int) int {
	s := &syms[i]
	right := &syms[s.next]
	s.id = s.newID
	s.next = right.next
	right.rank = noMerge // the right symbol is gone; its queued merges are stale
	if s.next >= 0 {
		syms[s.next].prev = int32(i)
	}
	m.setPair(syms, i)
	if s.prev >= 0 {
		m.setPair(syms, int(s.prev))
	}
	return int(s.prev)
}

// mergeAll applies merges until none applies: always the lowest rank, the leftmost on ties
// (what HF's Word::merge_all does with its priority queue). Each adjacent pair is looked up
// once when it forms. Short words find the next merge by a scan; long ones use a heap.
func (m *bpeModel) mergeAll(syms []symbol, sc *bpeScratch) []symbol {
	if len(syms) < 2 {
		return syms
	}
	for i := range syms {
		m.setPair(syms, i)
	}
	if len(syms) <= 32 {
		for {
			best, bestRank := -1, noMerge
			for i := 0; i >= 0; i = int(syms[i].next) {
				if syms[i].rank < bestRank {
					best, bestRank = i, syms[i].rank
				}
			}
			if best < 0 {
				return syms
			}
			m.mergeAt(syms, best)
		}
	}
	h := sc.heap[:0]
	for i := range syms {
		if r := syms[i].rank; r != noMerge {
			h = heapPush(h, uint64(r)<<32|uint64(i))
		}
	}
	for len(h) > 0 {
		var top uint64
		top, h = heapPop(h)
		i := int(uint32(top))
		if syms[i].rank != uint32(top>>32) {
			continue // stale: the pair at i changed (a rank names one pair)
		}
		prev := m.mergeAt(syms, i)
		if r := syms[i].rank; r != noMerge {
			h = heapPush(h, uint64(r)<<32|uint64(i))
		}
		if prev >= 0 {
			if r := syms[prev].rank; r != noMerge {
				h = heapPush(h, uint64(r)<<32|uint64(prev))
			}
		}
	}
	sc.heap = h
	return syms
}

// heapPush and heapPop keep a 4-ary min-heap of rank<<32|position keys.
func heapPush(h []uint64, x uint64) []uint64 {
	h = append(h, x)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 4
		if h[p] <= x {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
	return h
}

func heapPop(h []uint64) (uint64, []uint64) {
	top := h[0]
	n := len(h) - 1
	x := h[n]
	h = h[:n]
	if n == 0 {
		return top, h
	}
	i := 0
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		best := c
		for k := c + 1; k < c+4 && k < n; k++ {
			if h[k] < h[best] {
				best = k
			}
		}
		if h[best] >= x {
			break
		}
		h[i] = h[best]
		i = best
	}
	h[i] = x
	return top, h
}

// bytesToUnicode is GPT-2's byte-to-character table used by ByteLevel.
func bytesToUnicode() [256]rune {
	var t [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff) {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}

// decodeByteLevel turns a byte-level token string back into the raw bytes it stands for.
func decodeByteLevel(s string, inv map[rune]byte) (string, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := inv[r]
		if !ok {
			return "", false
		}
		out = append(out, b)
	}
	return string(out), true
}

func fallbackToken(b byte) string { return fmt.Sprintf("<0x%02X>", b) }
