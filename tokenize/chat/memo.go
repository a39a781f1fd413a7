package chat

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kvgate/kvgate/internal/jsonlex"
	"github.com/zeebo/xxh3"
)

// RenderMemo lets a follow-up turn of a chat skip re-evaluating the turns rendered before.
// It holds two kinds of entry:
//
//   - a bound message (or tools array): its JSON bytes (and the template's content format)
//     -> the template value vLLM's preprocessing makes of it, so binding `messages` parses
//     and converts only the new messages;
//   - a loop iteration: (loop statement, the item) -> what the iteration did: its output,
//     its control result, and, in evaluation order, every value it read from outside the
//     iteration (at the maximal external expressions memo_scan.go marks) and every
//     namespace attribute it set.
//
// Why replay is exact: in Jinja2 an iteration of a for loop sees the outside world only
// through the names bound outside its body and affects it only through its output and
// namespace attribute writes (a `set` inside a loop is loop-scoped; lists and dicts are
// immutable in the sandbox). Given the same item, the iteration's evaluation is a function of
// the values it reads from outside, in order; replay re-evaluates each recorded read in the
// new context, applying the recorded writes in between, and compares strictly (kind, bits,
// bytes, key order): when all are equal the evaluation would take the same path and produce
// the same output and writes. On any difference the writes are undone and the iteration is
// evaluated normally. Iterations the record cannot capture are never stored: a macro or
// loop.cycle call, a name bound in the body read before its assignment (it resolves outside),
// a recorded value that is a namespace, loop or callable (identity, not value), an error.
// A replayed read never runs a macro (it fails instead), so a failed replay has no effect
// beyond the writes it undoes.
//
// Lazy sets: `set x = E` with E external and total (memo_scan.go totalInt: an int built from
// int constants, the loop's own loop.index0 and the like, the render's messages|length, +
// and -) keeps E's read in the record only if the iteration reads x (lookup finds x's
// binding), at the set's place, as an eager read would be. Dropping it otherwise is exact:
// the iteration's path is a function of the values it reads, and it never read x, so x's
// value in the new context cannot change the path; E's evaluation has no other effect (no
// error, output, write or loop step, which is what totalInt guarantees). Qwen3's pre-scan
// binds `index` from `messages|length` every iteration and reads it in one at most: its
// other iterations now replay though the length changes every turn. A lookup that finds a
// reused binding slot may keep a read that could have been dropped, never the reverse.
//
// Keys are compared in full: message bytes; an item that is a bound message by the bound
// entry's identity (its id, unique per stored content), any other item by strict value; the
// hash only picks the set. Lookups take no lock (entries are immutable once published
// through an atomic slot); inserts and evictions take one mutex. Memory: see memo_store.go.
type RenderMemo struct {
	seed     uint64
	slots    []memoSlot
	shift    uint // 64 - log2(sets): a set is the top bits of the hash, remixed
	maxBytes int64

	mu       sync.Mutex // serializes inserts, evictions, the list and the generations
	list     memoEntry  // sentinel of the insertion-order list
	gens     []*memoGen // generations holding live entries, oldest first; the last is current
	genBytes int64      // slab bytes a generation takes before the next starts
	nextID   uint64
	bytes    atomic.Int64

	hits, misses, evictions atomic.Uint64
}

const memoWays = 4

// MinRenderMemoBytes is the smallest bound NewRenderMemo accepts.
const MinRenderMemoBytes = 64 << 10

// DefaultRenderMemoBytes is the proxy's default bound (-render-memo-bytes).
const DefaultRenderMemoBytes = 32 << 20

// memoQuietLoop: recorded iterations without output, none stored, after which a loop is
// no longer memoized.
const memoQuietLoop = 64

// memoEntryGuess sizes the slot table: an entry is typically one message's output.
const memoEntryGuess = 1024

type memoEntry struct {
	hash   uint64
	loop   *stmt // nil: a bound message
	format ContentFormat
	raw    string // a bound message's JSON
	val    Value  // a bound message's value; an iteration's item (when itemID is 0)
	// id: a bound message's identity, carried by its value (dictVal.memoID) and kept when
	// the entry is copied forward; itemID: the id of an iteration's item, which then is
	// that bound message.
	id, itemID uint64
	ev         []memoEvent
	out        string
	ctl        ctl
	steps      int
	ref        atomic.Bool
	note       atomic.Pointer[TokenNote] // an iteration's, set at most once (memo_note.go)

	slot       int        // under mu
	prev, next *memoEntry // under mu
	gen        *memoGen   // under mu
}

// memoEvent is a recorded read (e != nil: e evaluated to v) or write (s, a set of
// namespace attribute, assigned v). lazy: the read is a lazy set's value whose name the
// iteration has not read (yet); commit drops such reads.
type memoEvent struct {
	e    *expr
	s    *stmt
	v    Value
	lazy bool
}

// lazyRef ties a lazy set's binding (its index in vars) to its recorded read.
type lazyRef struct{ slot, ev int }

// lazyRead marks the reads of the lazy sets bound at slot as needed. A slot the iteration
// has since reused for another binding marks a read that was not needed: that only keeps
// a record that could have been dropped.
func (r *renderer) lazyRead(slot int) {
	for _, l := range r.lazy {
		if l.slot == slot {
			r.recEv[l.ev].lazy = false
		}
	}
}

// MemoUse tells what one render took from the memo (/debug/explain).
type MemoUse struct {
	Iterations int // iterations of memoized loops
	Replayed   int // of which replayed from the memo
	Messages   int // messages bound
	Bound      int // of which taken from the memo
}

// RenderMemoStats are a memo's counters.
type RenderMemoStats struct {
	Hits, Misses, Evictions uint64
	Bytes                   int64
}

// NewRenderMemo returns a memo bounded by maxBytes.
func NewRenderMemo(maxBytes int64) (*RenderMemo, error) {
	if maxBytes < MinRenderMemoBytes {
		return nil, fmt.Errorf("chat: render memo bound %d bytes: want >= %d", maxBytes, MinRenderMemoBytes)
	}
	log := 63 - bits.LeadingZeros64(uint64(maxBytes/(memoWays*memoEntryGuess)))
	m := &RenderMemo{seed: rand.Uint64() | 1, slots: make([]memoSlot, memoWays<<log),
		shift: uint(64 - log), maxBytes: maxBytes}
	m.list.next, m.list.prev = &m.list, &m.list
	m.genBytes = max(maxBytes/16, 16<<10)
	m.gens = []*memoGen{{limit: m.genBytes}}
	m.bytes.Store(int64(len(m.slots)) * memoSlotBytes)
	return m, nil
}

// Stats returns the memo's counters.
func (m *RenderMemo) Stats() RenderMemoStats {
	return RenderMemoStats{Hits: m.hits.Load(), Misses: m.misses.Load(), Evictions: m.evictions.Load(), Bytes: m.bytes.Load()}
}

func (m *RenderMemo) setIndex(h uint64) int {
	if m.shift == 64 {
		return 0
	}
	return int((h*0xff51afd7ed558ccd)>>m.shift) * memoWays
}

func (m *RenderMemo) set(h uint64) []memoSlot {
	i := m.setIndex(h)
	return m.slots[i : i+memoWays : i+memoWays]
}

// memoSlot is one way of a set: an entry and its hash beside it, so that a lookup reads
// the set's hashes from one or two cache lines and follows only the entry whose hash
// matches, not every way's.
type memoSlot struct {
	hash atomic.Uint64
	e    atomic.Pointer[memoEntry]
}

const memoSlotBytes = int64(unsafe.Sizeof(memoSlot{}))

// Load returns the slot's entry (nil: empty).
func (s *memoSlot) Load() *memoEntry { return s.e.Load() }

// get returns the slot's entry if its hash is h. The hash and the pointer are stored
// apart, so the entry's own hash is checked too.
func (s *memoSlot) get(h uint64) *memoEntry {
	if s.hash.Load() != h {
		return nil
	}
	if e := s.e.Load(); e != nil && e.hash == h {
		return e
	}
	return nil
}

// store puts e in the slot (under mu).
func (s *memoSlot) store(e *memoEntry) {
	s.hash.Store(e.hash)
	s.e.Store(e)
}

func (e *memoEntry) touch() {
	if !e.ref.Load() {
		e.ref.Store(true)
	}
}

func mix(h, x uint64) uint64 {
	h ^= x
	h *= 0x9e3779b97f4a7c15
	return h ^ h>>29
}

// hashValue hashes v's value as sameValue compares it.
func hashValue(h uint64, v Value) uint64 {
	h = mix(h, uint64(v.k))
	switch v.k {
	case kBool, kInt, kFloat:
		h = mix(h, uint64(v.n))
	case kString, kUndefined:
		h = mix(h, xxh3.HashString(v.s))
	case kList:
		for _, it := range v.lst().items {
			h = hashValue(h, it)
		}
	case kDict:
		if v.dct().memoH != 0 {
			return mix(h, v.dct().memoH)
		}
		for i, k := range v.dct().keys {
			h = mix(h, xxh3.HashString(k))
			h = hashValue(h, v.dct().vals[i])
		}
	default:
		h = mix(h, uint64(uintptr(v.p)))
	}
	return h
}

// sameValue is strict equality: what a template can observe of a and b is the same (kind,
// float bits, bytes, key order; Python's 1 == 1.0 == True does not count).
func sameValue(a, b Value) bool {
	if a.k != b.k {
		return false
	}
	switch a.k {
	case kNone:
		return true
	case kBool, kInt, kFloat:
		return a.n == b.n
	case kString, kUndefined:
		return a.s == b.s
	case kList:
		x, y := a.lst(), b.lst()
		if x == y {
			return true
		}
		if x.isTuple != y.isTuple || len(x.items) != len(y.items) {
			return false
		}
		for i := range x.items {
			if !sameValue(x.items[i], y.items[i]) {
				return false
			}
		}
		return true
	case kDict:
		x, y := a.dct(), b.dct()
		if x == y {
			return true
		}
		if x.memoH != 0 && y.memoH != 0 && x.memoH != y.memoH {
			return false
		}
		if len(x.keys) != len(y.keys) {
			return false
		}
		for i, k := range x.keys {
			if y.keys[i] != k || !sameValue(x.vals[i], y.vals[i]) {
				return false
			}
		}
		return true
	}
	return a.p == b.p && a.s == b.s && a.n == b.n
}

// Binding messages.

var errNoSplit = errors.New("chat: messages not split")

// bindMessagesMemo binds the messages array element by element through the memo. It gives
// up (false) on anything but a well-formed array of parseable, convertible messages; the
// caller then takes the ordinary path, which also reports the error.
func (r *renderer) bindMessagesMemo(raw []byte, format ContentFormat) (Value, bool) {
	i := jsonlex.SkipWS(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return undefined, false
	}
	i = jsonlex.SkipWS(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return undefined, false // empty: the ordinary path is as fast
	}
	spans := r.spans[:0]
	for j := i; ; {
		end, err := skipJSONValue(raw, j)
		if err != nil || end == j {
			return undefined, false
		}
		spans = append(spans, j, end)
		j = jsonlex.SkipWS(raw, end)
		if j >= len(raw) {
			return undefined, false
		}
		if raw[j] == ']' {
			if jsonlex.SkipWS(raw, j+1) != len(raw) {
				return undefined, false
			}
			break
		}
		if raw[j] != ',' {
			return undefined, false
		}
		j = jsonlex.SkipWS(raw, j+1)
	}
	r.spans = spans
	n := len(spans) / 2
	items := r.a.valSlice(n)
	bound := 0
	for k := range n {
		v, hit, ok := r.boundMessage(raw[spans[2*k]:spans[2*k+1]], format)
		if !ok {
			return undefined, false
		}
		items[k] = v
		if hit {
			bound++
		}
	}
	if r.memoUse != nil {
		r.memoUse.Messages += n
		r.memoUse.Bound += bound
	}
	return r.a.list(items, false), true
}

// boundMessage returns el's converted value from the memo, or converts and stores it.
func (r *renderer) boundMessage(el []byte, format ContentFormat) (v Value, hit, ok bool) {
	m := r.memo
	h := mix(m.seed^uint64(format+1), xxh3.Hash(el)) | 1
	set := m.set(h)
	for i := range set {
		e := set[i].get(h)
		if e != nil && e.loop == nil && e.format == format && e.raw == string(el) {
			e.touch()
			r.memoHits++
			return e.val, true, true
		}
	}
	r.memoMisses++
	// Parsed and converted in the render's arena; the memo keeps a copy in its slabs.
	pv, err := parseJSONDepth(&r.a, el, 1) // depth 1, as an element of the array
	if err != nil {
		return undefined, false, false
	}
	cm, err := convertMessage(&r.a, pv, format)
	if err != nil || cm.k != kDict {
		return undefined, false, false
	}
	if v, ok := m.storeBound(h, format, el, cm); ok {
		return v, false, true
	}
	return cm, false, true
}

// skipJSONValue returns the end of the JSON value at i: strings and nesting are followed
// exactly, the rest is left to the parser, which sees every element on its own.
func skipJSONValue(b []byte, i int) (int, error) {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			end := stringEnd(b, i+1)
			if end < 0 {
				return 0, errNoSplit
			}
			i = end - 1
			if depth == 0 {
				return end, nil
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i, nil
			}
			depth--
			if depth == 0 {
				return i + 1, nil
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, nil
			}
		}
	}
	if depth != 0 {
		return 0, errNoSplit
	}
	return i, nil
}

// toolsFormat tags a bound tools array in an entry's format (a message's is its content
// format).
const toolsFormat ContentFormat = 0xff

// boundTools returns the request's tools as preprocessTools makes them, from the memo or
// converted and stored; false when they do not convert (the caller reports the error).
func (r *renderer) boundTools(raw []byte) (Value, bool) {
	m := r.memo
	h := mix(m.seed^uint64(toolsFormat), xxh3.Hash(raw)) | 1
	set := m.set(h)
	for i := range set {
		if e := set[i].get(h); e != nil && e.loop == nil && e.format == toolsFormat && e.raw == string(raw) {
			e.touch()
			r.memoHits++
			return e.val, true
		}
	}
	r.memoMisses++
	v, err := preprocessTools(&r.a, raw)
	if err != nil || v.k != kList {
		return undefined, false
	}
	if sv, ok := m.storeBound(h, toolsFormat, raw, v); ok {
		return sv, true
	}
	return v, true
}

// stringEnd returns the end of the JSON string whose body starts at i (past its closing
// quote), -1 if it does not close. Nothing in the body is checked: an element is parsed in
// full before it is stored, and a later one must equal a stored one byte for byte.
func stringEnd(b []byte, i int) int {
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return -1
		}
		q += i
		n := 0
		for j := q - 1; j >= i && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		i = q + 1
	}
}

// Loop iterations.

// iterKey hashes the key of an iteration of loop s over item.
func (m *RenderMemo) iterKey(s *stmt, item Value) uint64 {
	return hashValue(mix(m.seed, uint64(uintptr(unsafe.Pointer(s)))), item) | 1
}

// replay serves the iteration of s over item (its frame bound) from the memo: true, with
// its control result, when a record's reads all match.
func (r *renderer) replay(s *stmt, item Value, h uint64) (ctl, bool) {
	m := r.memo
	set := m.set(h)
	for i := range set {
		e := set[i].get(h)
		if e == nil || e.loop != s {
			continue
		}
		if e.itemID != 0 {
			if item.k != kDict || item.dct().memoID != e.itemID {
				continue
			}
		} else if !sameValue(e.val, item) {
			continue
		}
		if r.steps+e.steps > maxLoopSteps || len(r.out)+len(e.out) > maxOutput {
			break // let the evaluation report it
		}
		if r.replayEvents(e.ev) {
			e.touch()
			r.memoHits++
			if r.outSpans != nil && len(e.out) > 0 {
				*r.outSpans = append(*r.outSpans, OutSpan{Start: len(r.out), Len: len(e.out), entry: e, memo: m})
			}
			r.out = append(r.out, e.out...)
			r.steps += e.steps
			return e.ctl, true
		}
	}
	r.memoMisses++
	return ctlNone, false
}

type memoUndo struct {
	d   *dictVal
	key string
	old Value
	had bool
}

func (r *renderer) replayEvents(ev []memoEvent) bool {
	r.replaying = true
	r.memoBad = false
	r.undo = r.undo[:0]
	ok := true
	for _, x := range ev {
		if x.e != nil {
			v, err := r.eval(x.e)
			if err != nil || r.memoBad || !sameValue(v, x.v) {
				ok = false
				break
			}
			continue
		}
		ns, _ := r.lookup(x.s.targets[0])
		if ns.k != kNS {
			ok = false
			break
		}
		old, had := ns.dct().get(x.s.attr)
		r.undo = append(r.undo, memoUndo{ns.dct(), x.s.attr, old, had})
		ns.dct().set(x.s.attr, x.v)
	}
	r.replaying = false
	if !ok {
		for i := len(r.undo) - 1; i >= 0; i-- {
			u := r.undo[i]
			if u.had {
				u.d.set(u.key, u.old)
			} else {
				u.d.del(u.key)
			}
		}
	}
	clear(r.undo)
	r.undo = r.undo[:0]
	r.memoBad = false
	return ok
}

// recordRead evaluates an external expression while an iteration is recorded, and records
// its value.
func (r *renderer) recordRead(e *expr) (Value, error) {
	frame := r.recFrame
	r.recording, r.recFrame = false, 0
	v, err := r.eval(e)
	r.recording, r.recFrame = true, frame
	if err == nil {
		r.recEv = append(r.recEv, memoEvent{e: e, v: v})
	}
	return v, err
}

// commit stores the iteration just recorded: item, the output since mark, its control
// result and the loop steps it took.
func (r *renderer) commit(s *stmt, item Value, h uint64, mark int, c ctl, steps int) {
	if r.memoBad {
		return
	}
	kept := r.recEv[:0]
	for _, x := range r.recEv {
		if !x.lazy {
			kept = append(kept, x)
		}
	}
	dropped := len(r.recEv) - len(kept)
	clear(r.recEv[len(kept):])
	r.recEv = kept
	if len(r.out) == mark && dropped == 0 {
		// An iteration without output (a pre-scan setting namespace attributes) costs
		// about what its replay would, which re-evaluates the same reads: storing it would
		// only cost memory. One that dropped a lazy set's read replays cheaper than it
		// evaluates (bench/RESULTS.md, Session 6), so it is stored.
		if s.memoEmpty.Load() < memoQuietLoop {
			s.memoEmpty.Add(1)
		}
		return
	}
	if s.memoStored.Load() == 0 {
		s.memoStored.Add(1)
	}
	for _, x := range r.recEv {
		if !copyable(x.v) {
			return
		}
	}
	if !copyable(item) {
		return
	}
	r.memo.storeIter(&memoEntry{hash: h, loop: s, ctl: c, steps: steps, val: item, ev: r.recEv, out: unsafe.String(unsafe.SliceData(r.out[mark:]), len(r.out)-mark)})
}
