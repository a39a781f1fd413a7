// Package tokenize loads HF tokenizer.json files and encodes text to token IDs exactly as the
// HF tokenizers library does (the engines' tokenizer), in pure Go. It also renders chat
// templates (subpackage chat) and keeps a pool of models keyed by served model name.
//
// The pipeline is HF's: added tokens split the raw text (leftmost-longest), each remaining
// piece is normalized and split on the normalized added tokens, pre-tokenized into words, and
// each word goes through BPE (lowest merge rank first, leftmost on ties); the post-processor
// adds special tokens. What keeps it exact:
//   - The split regexes of the known families (Qwen2/3, Llama 3 / cl100k, GPT-4o / o200k,
//     DeepSeek-V3, GPT-2) are hand-coded scanners that reproduce the backtracking engine's
//     choices; any other regex runs on regexp2. Character classes come from the HF library's
//     own regex engine (unicode_tables.go, tools/gen-tok-unicode.js), which is newer than Go's
//     Unicode 15 tables.
//   - NFC/NFKC runs of more than 30 combining marks are normalized whole, as Rust does (Go's
//     norm package would insert U+034F there).
//   - Anything a tokenizer.json asks for that is not implemented fails the load, naming it.
//
// Speed: byte-level models work on raw bytes (no byte-to-char mapping), words go through a
// lock-free word cache, and SentencePiece-style models cut their long "words" (whole
// segments) before each run of '▁' where the vocabulary proves no merge can cross.
// truncation and padding in tokenizer.json are ignored, as vLLM's tokenizer calls ignore them.
package tokenize

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/kvgate/kvgate/tokenize/chat"
	"golang.org/x/text/unicode/norm"
)

// Tokenizer is a loaded tokenizer.json. It is safe for concurrent use.
type Tokenizer struct {
	norm       []normStep
	pre        []preStep
	model      *bpeModel
	rawTrie    *tokenTrie // added tokens matched on raw text
	normTrie   *tokenTrie // added tokens matched on normalized text
	postPrefix []uint32   // add_special_tokens=true: IDs before the sequence
	postSuffix []uint32   // ... and after it

	addedByContent map[string]uint32
	cache          *wordCache
	scratch        sync.Pool // *encodeState
	memoSalt       uint64    // this tokenizer's part of a Memo's hash
	byteSegs       byteSegs  // the IDs of one-byte ASCII segments, computed once at load
}

// byteSegs holds the IDs of every one-byte ASCII segment between raw added tokens, for
// either value of first: a chat prompt has one such segment per message (the "\n" between
// an end and the next start token), and the full normalize, pre-tokenize and model path
// costs ~150 ns for each. Exact for the reason the Memo is (see Memo): a segment's IDs are a
// function of the tokenizer, its bytes and first, computed here by that same path.
type byteSegs struct {
	ids [256][byteSegMaxIDs]uint32 // index: byte<<1 | first
	n   [256]uint8                 // the IDs' count, byteSegNone when not held
}

const (
	byteSegMaxIDs = 3
	byteSegNone   = 0xff
)

// encodeState is the per-call scratch, pooled.
type encodeState struct {
	normBuf  [2][]byte
	normIter norm.Iter
	matches  []addedMatch
	nmatches []addedMatch
	spans    [2][]span
	text     []byte // rebuilt text for pre-tokenizers that change content
	valid    []byte // input with invalid UTF-8 replaced
	bpe      bpeScratch
	err      error // first failure of this call (a fallback regex that timed out)

	memoHits, memoMisses uint64 // this call's segment lookups, added to the Memo once
	memoNotes            uint64 // this call's token notes used
	memoHitTokens        int    // IDs this call took from the Memo
	marks                []chat.NoteMark
}

func (t *Tokenizer) init() {
	t.cache = newWordCache()
	t.model.vocabStrings = nil
	t.scratch.New = func() any { return &encodeState{} }
	t.memoSalt = nextMemoSalt()
	t.initByteSegs()
}

// initByteSegs fills byteSegs by encoding each one-byte ASCII segment the ordinary way; one
// that fails or has more than byteSegMaxIDs IDs stays on the ordinary path.
func (t *Tokenizer) initByteSegs() {
	st := &encodeState{}
	var ids []uint32
	for i := range t.byteSegs.n {
		t.byteSegs.n[i] = byteSegNone
		seg := string(rune(i >> 1)) // i>>1 < 128: one byte
		st.err = nil
		ids = t.encodeSegment(ids[:0], st, seg, i&1 == 1)
		if st.err == nil && len(ids) <= byteSegMaxIDs {
			t.byteSegs.n[i] = uint8(copy(t.byteSegs.ids[i][:], ids))
		}
	}
}

// TokenID returns the ID of an added token or vocabulary entry (the raw string as written
// in tokenizer.json), and whether it exists.
func (t *Tokenizer) TokenID(s string) (uint32, bool) {
	if id, ok := t.addedByContent[s]; ok {
		return id, true
	}
	if !t.model.byteLevel {
		id, ok := t.model.vocab[s]
		return id, ok
	}
	return 0, false
}

// Encode appends the token IDs of text to dst[:0] and returns it. With addSpecialTokens the
// post-processor's special tokens are added (e.g. the BOS of Llama 2 / Gemma), as HF does for
// encode(text, add_special_tokens=True). Invalid UTF-8 is read as U+FFFD per bad byte, as Go's
// JSON decoder would have turned it.
func (t *Tokenizer) Encode(dst []uint32, text string, addSpecialTokens bool) ([]uint32, error) {
	return t.EncodeMemo(dst, text, addSpecialTokens, nil)
}

// EncodeMemo is Encode through memo (nil: none), with the same result: the IDs of the text
// between added tokens come from the memo when it holds them, and go into it when not.
func (t *Tokenizer) EncodeMemo(dst []uint32, text string, addSpecialTokens bool, memo *Memo) ([]uint32, error) {
	return t.encodeMemoUse(dst, text, addSpecialTokens, memo, nil)
}

// MemoUse is what one encode took from a Memo (for /debug/explain): segments and their IDs,
// of which Notes replayed chat iterations served whole (notes.go).
type MemoUse struct{ Segments, Tokens, Notes int }

func (t *Tokenizer) encodeMemoUse(dst []uint32, text string, addSpecialTokens bool, memo *Memo, use *MemoUse) ([]uint32, error) {
	dst = dst[:0]
	if addSpecialTokens {
		dst = append(dst, t.postPrefix...)
	}
	dst, err := t.appendEncode(dst, text, memo, use, nil)
	if err != nil {
		return dst[:0], err
	}
	if addSpecialTokens {
		dst = append(dst, t.postSuffix...)
	}
	return dst, nil
}

// MaxTextBytes is the longest text Encode accepts (offsets are 32-bit).
const MaxTextBytes = 1 << 30

// appendEncode appends the IDs of text (no post-processing) to dst, through memo when it is
// not nil, and through the notes of spans (see noteSpans) when memo is not nil.
func (t *Tokenizer) appendEncode(dst []uint32, text string, memo *Memo, use *MemoUse, spans []chat.OutSpan) ([]uint32, error) {
	if len(text) > MaxTextBytes {
		return dst, fmt.Errorf("tokenize: text of %d bytes is over the %d-byte limit", len(text), MaxTextBytes)
	}
	if memo != nil && t.rawTrie.empty { // MemoUnsupported
		memo = nil
	}
	st := t.scratch.Get().(*encodeState)
	st.err = nil
	st.text = st.text[:0]
	if !utf8.ValidString(text) {
		st.valid = appendValidUTF8(st.valid[:0], text)
		text = unsafeString(st.valid)
		spans = nil // the offsets moved
	}
	// 1. Added tokens that match raw text split it first.
	st.matches = t.rawTrie.find(st.matches[:0], text)
	if len(st.matches) == 0 {
		// One segment, the whole text: memoized, it would serve only an exact repeat and
		// crowd out the segments of chats (a plain completions prompt is such a text).
		memo = nil
	}
	if memo == nil {
		spans = nil
	}
	ns := noteSpans{spans: spans, marks: st.marks}
	prev := 0
	ms := st.matches
	for j := 0; j < len(ms); j++ {
		m := ms[j]
		if prev < m.start {
			dst = t.encodeRawSegment(dst, st, text[prev:m.start], prev == 0, memo)
		}
		if len(ns.spans) > 0 {
			if k := ns.at(t, ms, j, len(dst)); k > 0 {
				note := ns.spans[0].Note()
				dst = append(dst, note.IDs...)
				st.memoHits += uint64(k - 1)
				st.memoHitTokens += len(note.IDs) - k
				st.memoNotes++
				j += k - 1
				prev = ms[j].end
				continue
			}
		}
		dst = append(dst, m.id)
		prev = m.end
		if ns.noting {
			ns.noted(t, st, ms, j, dst)
		}
	}
	if prev < len(text) {
		dst = t.encodeRawSegment(dst, st, text[prev:], prev == 0, memo)
	}
	if st.memoHits|st.memoMisses|st.memoNotes != 0 {
		memo.hits.Add(st.memoHits)
		memo.misses.Add(st.memoMisses)
		memo.notes.Add(st.memoNotes)
		if use != nil {
			use.Segments, use.Tokens, use.Notes = int(st.memoHits), st.memoHitTokens, int(st.memoNotes)
		}
		st.memoHits, st.memoMisses, st.memoHitTokens, st.memoNotes = 0, 0, 0, 0
	}
	clear(ns.marks)
	st.marks = ns.marks[:0]
	err := st.err
	st.err = nil
	if st.heapBytes() <= maxPooledScratch { // one huge request's buffers are not kept
		t.scratch.Put(st)
	}
	return dst, err
}

// maxPooledScratch bounds the buffers of an encodeState put back in the pool: sync.Pool
// keeps an item as long as steady load takes it out again, so one huge request's buffers
// would otherwise stay for good (as renderScratch caps its output).
const maxPooledScratch = 2 << 20

// heapBytes is what st's buffers hold (their capacities).
func (st *encodeState) heapBytes() int {
	n := cap(st.normBuf[0]) + cap(st.normBuf[1]) + cap(st.text) + cap(st.valid) + cap(st.bpe.str)
	n += (cap(st.matches) + cap(st.nmatches)) * int(unsafe.Sizeof(addedMatch{}))
	n += (cap(st.spans[0]) + cap(st.spans[1])) * int(unsafe.Sizeof(span{}))
	n += cap(st.bpe.syms)*int(unsafe.Sizeof(symbol{})) + cap(st.bpe.heap)*8
	return n + cap(st.marks)*int(unsafe.Sizeof(chat.NoteMark{}))
}

// encodeRawSegment is encodeSegment through memo (see Memo for why a segment between raw
// added tokens may be memoized). A segment whose encoding failed is not stored.
func (t *Tokenizer) encodeRawSegment(dst []uint32, st *encodeState, seg string, first bool, memo *Memo) []uint32 {
	if len(seg) == 1 && seg[0] < utf8.RuneSelf {
		i := int(seg[0]) << 1
		if first {
			i |= 1
		}
		if n := t.byteSegs.n[i]; n != byteSegNone {
			return append(dst, t.byteSegs.ids[i][:n]...)
		}
	}
	if memo == nil || len(seg) < memoMinSegment {
		return t.encodeSegment(dst, st, seg, first)
	}
	if d, ok := memo.get(dst, t, seg, first); ok {
		st.memoHits++
		st.memoHitTokens += len(d) - len(dst)
		return d
	}
	st.memoMisses++
	n, failed := len(dst), st.err != nil
	dst = t.encodeSegment(dst, st, seg, first)
	if !failed && st.err == nil {
		memo.put(t, seg, first, dst[n:])
	}
	return dst
}

// encodeSegment normalizes a piece of raw text between added tokens, splits it on the
// normalized added tokens, and tokenizes the rest. first: the piece starts the input.
func (t *Tokenizer) encodeSegment(dst []uint32, st *encodeState, seg string, first bool) []uint32 {
	n := seg
	if len(t.norm) > 0 {
		var err error
		if n, err = normalize(t.norm, seg, &st.normBuf, &st.normIter); err != nil {
			if st.err == nil {
				st.err = err
			}
			return dst
		}
	}
	if t.normTrie.empty {
		return t.encodeNormalized(dst, st, n, first)
	}
	st.nmatches = t.normTrie.find(st.nmatches[:0], n)
	if len(st.nmatches) == 0 {
		return t.encodeNormalized(dst, st, n, first)
	}
	// encodeNormalized may reuse nmatches' scratch only through st.spans/text, not nmatches.
	matches := st.nmatches
	prev := 0
	for _, m := range matches {
		if prev < m.start {
			dst = t.encodeNormalized(dst, st, n[prev:m.start], first && prev == 0)
		}
		dst = append(dst, m.id)
		prev = m.end
	}
	if prev < len(n) {
		dst = t.encodeNormalized(dst, st, n[prev:], first && prev == 0)
	}
	return dst
}

// encodeNormalized pre-tokenizes normalized text and runs the model on each word.
func (t *Tokenizer) encodeNormalized(dst []uint32, st *encodeState, s string, first bool) []uint32 {
	if len(t.pre) == 0 {
		return t.encodeWord(dst, st, s)
	}
	text := s
	cur := append(st.spans[0][:0], span{0, int32(len(s))})
	next := st.spans[1][:0]
	for i := range t.pre {
		p := &t.pre[i]
		next = next[:0]
		switch p.kind {
		case preSplit:
			if p.pat == nil {
				next = append(next, cur...)
				break
			}
			for _, sp := range cur {
				next = splitStep(next, text[sp.start:sp.end], sp.start, p.pat, p.beh, p.invert, &st.err)
			}
		case preCharSplit:
			for _, sp := range cur {
				next = splitStep(next, text[sp.start:sp.end], sp.start, p.pat, p.beh, false, &st.err)
			}
		case preByteLevel:
			if p.addPrefixSpace {
				text, cur = rebuild(st, text, cur, func(b []byte, piece string, _ int32) []byte {
					if len(piece) > 0 && piece[0] != ' ' {
						b = append(b, ' ')
					}
					return append(b, piece...)
				})
			}
			if p.useRegex {
				for _, sp := range cur {
					next = splitStep(next, text[sp.start:sp.end], sp.start, p.pat, behIsolated, false, &st.err)
				}
			} else {
				next = append(next, cur...)
			}
		case preMetaspace:
			rep := p.replacement
			text, cur = rebuild(st, text, cur, func(b []byte, piece string, start int32) []byte {
				switch p.prependScheme {
				case prependAlways, prependFirst:
					if p.prependScheme == prependFirst && !(first && start == 0) {
						break
					}
					if !strings.HasPrefix(piece, " ") && !strings.HasPrefix(piece, rep) {
						b = append(b, rep...)
					}
				}
				for j := 0; j < len(piece); j++ {
					if piece[j] == ' ' {
						b = append(b, rep...)
					} else {
						b = append(b, piece[j])
					}
				}
				return b
			})
			if p.split {
				mp := pattern{lit: rep}
				for _, sp := range cur {
					next = splitStep(next, text[sp.start:sp.end], sp.start, &mp, behMergedWithNext, false, &st.err)
				}
			} else {
				next = append(next, cur...)
			}
		}
		cur, next = next, cur
	}
	for _, sp := range cur {
		dst = t.encodeWord(dst, st, text[sp.start:sp.end])
	}
	st.spans[0], st.spans[1] = cur[:0], next[:0]
	return dst
}

// rebuild maps each piece through f into a fresh text (in st.text), returning the new text and
// spans. Pieces of the old text stay valid: st.text only grows within one Encode.
func rebuild(st *encodeState, text string, cur []span, f func([]byte, string, int32) []byte) (string, []span) {
	b := st.text[len(st.text):]
	if cap(b) < 2*len(text)+64*len(cur) {
		b = make([]byte, 0, 2*len(text)+64*len(cur)+64)
	}
	for i, sp := range cur {
		start := len(b)
		b = f(b, text[sp.start:sp.end], sp.start)
		cur[i] = span{int32(start), int32(len(b))}
	}
	st.text = b
	return unsafeString(b), cur
}

// encodeWord runs the model on one word, through the word cache.
func (t *Tokenizer) encodeWord(dst []uint32, st *encodeState, w string) []uint32 {
	if len(w) == 0 {
		return dst
	}
	m := t.model
	if len(w) == 1 && m.byteLevel {
		if id := m.byteID[w[0]]; id >= 0 {
			return append(dst, uint32(id))
		}
		return dst
	}
	if len(w) > maxCachedWord {
		if m.metaChunks {
			return t.encodeChunks(dst, st, w)
		}
		return m.encodeWord(dst, w, &st.bpe)
	}
	if d, ok := t.cache.get(dst, w); ok {
		return d
	}
	n := len(dst)
	dst = m.encodeWord(dst, w, &st.bpe)
	t.cache.put(w, dst[n:])
	return dst
}

// encodeChunks encodes a long word of a SentencePiece-style model (where spaces became '▁') as
// the words that start at each run of '▁'. This gives the same IDs as merging the whole word:
// a merge across such a boundary would make a token holding "c▁" for the character c before
// the run, and the load checked that no token holds it (metaUnsafe lists the exceptions,
// where the word is not cut).
func (t *Tokenizer) encodeChunks(dst []uint32, st *encodeState, w string) []uint32 {
	m := t.model
	start := 0
	prevMeta := true // no cut at 0
	for i := 0; i < len(w); {
		r, n := utf8.DecodeRuneInString(w[i:])
		isMeta := r == metaChar
		if isMeta && !prevMeta && !m.metaUnsafeBefore(w[:i]) {
			dst = t.encodeChunk(dst, st, w[start:i])
			start = i
		}
		prevMeta = isMeta
		i += n
	}
	return t.encodeChunk(dst, st, w[start:])
}

func (t *Tokenizer) encodeChunk(dst []uint32, st *encodeState, w string) []uint32 {
	if len(w) > maxCachedWord {
		return t.model.encodeWord(dst, w, &st.bpe)
	}
	if d, ok := t.cache.get(dst, w); ok {
		return d
	}
	n := len(dst)
	dst = t.model.encodeWord(dst, w, &st.bpe)
	t.cache.put(w, dst[n:])
	return dst
}

// appendValidUTF8 appends s with each invalid byte replaced by U+FFFD.
func appendValidUTF8(dst []byte, s string) []byte {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, "\uFFFD"...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return dst
}

func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

func firstRune(s string) (rune, int) { return utf8.DecodeRuneInString(s) }
func lastRune(s string) (rune, int)  { return utf8.DecodeLastRuneInString(s) }

// MemoryBytes estimates the heap the tokenizer holds: vocabulary and merge tables, added-token
// tries and the word cache at its current fill.
func (t *Tokenizer) MemoryBytes() int64 {
	const mapSlack = 16 // tenths: slots left empty by growth, control bytes
	m := t.model
	var n int64
	for k := range m.vocab {
		n += int64(len(k)+7) &^ 7 // each key is its own allocation
	}
	n += int64(len(m.vocab)) * (16 + 4 + 4 + 1) * mapSlack / 10 // string header, value, padding, control byte
	n += int64(len(m.merges)) * (8 + 8 + 1) * mapSlack / 10
	for _, tr := range []*tokenTrie{t.rawTrie, t.normTrie} {
		n += int64(len(tr.nodes)) * 32
		for _, nd := range tr.nodes {
			n += int64(cap(nd.edges)) * 8
		}
		for _, tok := range tr.tokens {
			n += int64(len(tok.content)) + 48
		}
	}
	for k := range t.addedByContent {
		n += int64(len(k)) + 32
	}
	n += int64(len(m.metaUnsafe))*4 + 4*256*3
	return n + t.cache.memoryBytes()
}
