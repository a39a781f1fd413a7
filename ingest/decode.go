package ingest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"

	"github.com/kvgate/kvgate/engine"
)

// EventKind is the type of one decoded event.
type EventKind uint8

const (
	EventUnknown EventKind = iota
	EventStored
	EventRemoved
	EventCleared
	// EventInvalid is an event that could not be decoded (see Event.Bad); it was
	// skipped whole and the batch goes on.
	EventInvalid
)

// Medium is the cache tier an event refers to.
type Medium uint8

const (
	MediumGPU      Medium = iota // device memory (vLLM and SGLang "GPU")
	MediumCPU                    // host memory (vLLM "CPU", SGLang "CPU_PINNED")
	MediumStorage                // local disk (vLLM "STORAGE", SGLang "DISK")
	MediumExternal               // a shared or remote pool (SGLang "EXTERNAL", e.g. Mooncake)
	MediumOther                  // a tier kvgate does not know (a custom connector's name)
	numMedia
)

func (m Medium) String() string {
	switch m {
	case MediumGPU:
		return "GPU"
	case MediumCPU:
		return "CPU"
	case MediumStorage:
		return "STORAGE"
	case MediumExternal:
		return "EXTERNAL"
	}
	return "OTHER"
}

// BadReason says why one event could not be decoded; the rest of its batch still is.
type BadReason uint8

const (
	BadNone  BadReason = iota
	BadType            // a field of the wrong msgpack type (a map where a hash belongs...)
	BadRange           // a value out of range (a negative token id, a huge block size)
	numBadReasons
)

var badReasonNames = [...]string{"none", "type", "range"}

func (r BadReason) String() string { return badReasonNames[r] }

// Event is one decoded event. Its slices point into the decoder's reused buffers or the
// payload: they are valid until the next call to Next.
type Event struct {
	Kind      EventKind
	Bad       BadReason // EventInvalid: why
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	// Tokens are the token ids; for an EAGLE bigram store (Bigram) they are the pairs
	// flattened, [t0,t1, t1,t2, ...]: two words per token position.
	Tokens    []uint32
	Bigram    bool
	BlockSize int // tokens (bigram stores: pairs) per block
	Medium    Medium
	LoRAName  []byte
	// ExtraKeys holds the raw msgpack of extra_keys when present and not null.
	ExtraKeys []byte
	// CacheSalt is SGLang's metadata.cache_salt (HasSalt when present; "" is a salt).
	CacheSalt []byte
	HasSalt   bool
	// Group is vLLM's KV cache group (group_idx); -1 when absent (a single-group model).
	Group int
	// SpecKind is vLLM's kv_cache_spec_kind ("full_attention", "sliding_window",
	// "mamba"...); SlidingWindow its kv_cache_spec_sliding_window (0 = none).
	SpecKind      []byte
	SlidingWindow int
	// Component is SGLang's component type (FULL, SWA, MAMBA...) where published.
	Component []byte
}

var (
	errBatch = errors.New("ingest: batch is not [ts, [events...], dp_rank] nor {ts, events, data_parallel_rank}")
	errRange = errors.New("msgpack: value out of range")
)

// BatchDecoder walks one msgpack batch event by event, decoding into reused buffers:
// after warm-up it allocates nothing. A batch is an array [ts, [event...], (dp_rank)]
// (SGLang, and vLLM until its EventBatch stopped being array_like) or a map
// {"ts": ts, "events": [...], "data_parallel_rank": r} (current vLLM).
//
// An event that does not decode (a field of the wrong type, a value out of range) costs
// only itself: Next returns it as EventInvalid and the next event decodes as usual. Only
// a batch whose structure is broken (truncated, a length past its end) stops the walk.
type BatchDecoder struct {
	Engine engine.Kind // whose wire conventions apply: engine.SGLang's, else vLLM's
	r      reader
	outer  int  // elements in the batch array (map batch: pairs)
	isMap  bool // the batch is a map
	after  int  // map batch: pairs not yet read after "events"
	left   int  // events not yet read
	ts     float64
	dpRank int
	hashes []uint64
	tokens []uint32
}

// Reset starts decoding payload.
func (d *BatchDecoder) Reset(payload []byte) error {
	d.r.reset(payload)
	d.ts, d.dpRank, d.left, d.after = 0, -1, 0, 0
	d.outer, d.isMap = d.r.container()
	if d.r.err == nil && d.isMap {
		d.resetMap()
	} else if d.r.err == nil {
		if d.outer < 2 {
			d.r.fail(errBatch)
		}
		d.ts = d.r.float()
		d.left = d.r.arrayLen()
	}
	if d.r.err != nil {
		d.left = 0
		return d.r.err
	}
	return nil
}

// resetMap reads a map batch's pairs up to and including the "events" array head.
func (d *BatchDecoder) resetMap() {
	r := &d.r
	for i := 0; i < d.outer && r.err == nil; i++ {
		if d.batchField(r.str()) {
			d.left = r.arrayLen()
			d.after = d.outer - i - 1
			return
		}
	}
	r.fail(errBatch) // no events
}

// batchField reads the value of a map batch's key name, except "events" (true: the
// events array is next).
func (d *BatchDecoder) batchField(name []byte) bool {
	r := &d.r
	switch string(name) {
	case "events":
		return true
	case "ts":
		d.ts = r.float()
	case "data_parallel_rank", "attn_dp_rank":
		if !r.isNil() {
			v, _ := r.int()
			d.dpRank = int(int64(v))
		}
	default:
		r.skip()
	}
	return false
}

// Timestamp is the batch's ts.
func (d *BatchDecoder) Timestamp() float64 { return d.ts }

// Err is the first decoding error, if any.
func (d *BatchDecoder) Err() error { return d.r.err }

// Finish reads what follows the events: the data-parallel rank (-1 when absent).
func (d *BatchDecoder) Finish() (dpRank int, err error) {
	r := &d.r
	for d.left > 0 && r.err == nil {
		d.left--
		r.skip()
	}
	switch {
	case r.err != nil:
	case d.isMap:
		for ; d.after > 0 && r.err == nil; d.after-- {
			if d.batchField(r.str()) {
				r.skip() // a second "events": ignored
			}
		}
	case d.outer >= 3:
		if !r.isNil() {
			v, _ := r.int()
			d.dpRank = int(int64(v))
		}
		for i := 3; i < d.outer && r.err == nil; i++ {
			r.skip()
		}
	}
	return d.dpRank, r.err
}

// Next decodes the next event into ev. It returns false at the end of the events or on a
// broken batch (see Err). An event of an unknown type comes back as EventUnknown, one
// that does not decode as EventInvalid.
func (d *BatchDecoder) Next(ev *Event) bool {
	r := &d.r
	if d.left <= 0 || r.err != nil {
		return false
	}
	d.left--
	start := r.off
	*ev = Event{Hashes: d.hashes[:0], Tokens: d.tokens[:0], Group: -1}
	n, isMap := r.container()
	if r.err == nil {
		if isMap {
			d.decodeMap(ev, n)
		} else {
			d.decodeArray(ev, n)
		}
	}
	// Keep the grown buffers for the next event.
	d.hashes, d.tokens = ev.Hashes[:0], ev.Tokens[:0]
	if r.err == nil {
		return true
	}
	var bad BadReason
	switch r.err {
	case errType:
		bad = BadType
	case errRange:
		bad = BadRange
	default: // truncated or a length past the payload: the batch's structure is broken
		return false
	}
	// Skip exactly this event: rewind to its head and step over it whole.
	r.err, r.off = nil, start
	r.skip()
	if r.err != nil {
		return false
	}
	*ev = Event{Kind: EventInvalid, Bad: bad, Hashes: d.hashes[:0], Tokens: d.tokens[:0], Group: -1}
	return true
}

func kindOf(tag []byte) EventKind {
	switch string(tag) {
	case "BlockStored":
		return EventStored
	case "BlockRemoved":
		return EventRemoved
	case "AllBlocksCleared":
		return EventCleared
	}
	return EventUnknown
}

// Field numbers, in the order vLLM's BlockStored declares them.
const (
	fHashes = iota
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroup
	fSpecKind
	fSlidingWindow
	fOther
	// Fields only some layouts carry.
	fMetadata  // SGLang BlockStoredWithMetadata: {"cache_salt": s}
	fCacheSalt // a bare cache_salt key
	fComponent // SGLang component_type
	fSGLangTail
)

// SGLang's BlockStored is [tag, block_hashes, parent, token_ids, block_size, lora_id,
// medium] and its extensions append after medium: the metadata map, a component type.
const sglangStoredFixed = 6

var (
	vllmRemovedFields   = [...]int{fHashes, fMedium, fGroup}
	sglangRemovedFields = [...]int{fHashes, fMedium}
)

func (d *BatchDecoder) decodeArray(ev *Event, n int) {
	if n == 0 {
		d.r.fail(errType)
		return
	}
	tag := d.r.str()
	ev.Kind = kindOf(tag)
	sg := d.Engine == engine.SGLang
	for i := 0; i < n-1 && d.r.err == nil; i++ {
		f := fOther
		switch ev.Kind {
		case EventStored:
			switch {
			case sg && i >= sglangStoredFixed:
				f = fSGLangTail
			case i < fOther:
				f = i
			}
		case EventRemoved:
			switch {
			case sg && i < len(sglangRemovedFields):
				f = sglangRemovedFields[i]
			case sg:
				f = fSGLangTail
			case i < len(vllmRemovedFields):
				f = vllmRemovedFields[i]
			}
		}
		d.field(ev, f)
	}
}

func fieldOf(name []byte) int {
	switch string(name) {
	case "block_hashes":
		return fHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokens
	case "block_size":
		return fBlockSize
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroup
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	case "metadata":
		return fMetadata
	case "cache_salt":
		return fCacheSalt
	case "component_type":
		return fComponent
	}
	return fOther
}

func (d *BatchDecoder) decodeMap(ev *Event, n int) {
	for i := 0; i < n && d.r.err == nil; i++ {
		name := d.r.str()
		if string(name) == "type" {
			ev.Kind = kindOf(d.r.str())
			continue
		}
		d.field(ev, fieldOf(name))
	}
}

// smallInt reads a non-negative integer up to max (nil: ok false).
func (r *reader) smallInt(max uint64) (int, bool) {
	if r.isNil() {
		return 0, false
	}
	v, neg := r.int()
	if r.err == nil && (neg || v > max) {
		r.fail(errRange)
	}
	return int(v), r.err == nil
}

func (d *BatchDecoder) field(ev *Event, f int) {
	r := &d.r
	switch f {
	case fHashes:
		if r.isNil() {
			return
		}
		for k := r.arrayLen(); k > 0 && r.err == nil; k-- {
			ev.Hashes = append(ev.Hashes, d.hash())
		}
	case fParent:
		if r.isNil() {
			return
		}
		ev.Parent, ev.HasParent = d.hash(), true
	case fTokens:
		if r.isNil() {
			return
		}
		d.tokenIDs(ev)
	case fBlockSize:
		if v, ok := r.smallInt(1 << 20); ok {
			ev.BlockSize = v
		}
	case fMedium:
		if r.isNil() {
			return
		}
		m := r.str()
		ev.Medium = mediumOf(m)
		if ev.Medium == MediumOther && d.Engine == engine.SGLang {
			ev.Component = m // perhaps a component type written before medium (see fSGLangTail)
		}
	case fLoRAName:
		if r.isNil() {
			return
		}
		ev.LoRAName = r.str()
	case fExtraKeys:
		if r.isNil() {
			return
		}
		start := r.off
		r.skip()
		ev.ExtraKeys = r.p[start:r.off]
	case fGroup:
		if v, ok := r.smallInt(1 << 16); ok {
			ev.Group = v
		}
	case fSpecKind:
		if !r.isNil() {
			ev.SpecKind = r.str()
		}
	case fSlidingWindow:
		if v, ok := r.smallInt(1 << 31); ok {
			ev.SlidingWindow = v
		}
	case fMetadata:
		d.metadata(ev)
	case fCacheSalt:
		if !r.isNil() {
			ev.CacheSalt, ev.HasSalt = r.str(), true
		}
	case fComponent:
		if !r.isNil() {
			ev.Component = r.str()
		}
	case fSGLangTail:
		// After medium, SGLang appends the metadata map and/or a component type.
		c, ok := r.peek()
		switch {
		case !ok:
		case c&0xf0 == 0x80 || c == 0xde || c == 0xdf:
			d.metadata(ev)
		case c&0xe0 == 0xa0 || c == 0xd9 || c == 0xda || c == 0xdb:
			// SGLang's component-typed stores (BlockStoredWithComponentType: FULL, SWA,
			// MAMBA...) add component_type; its position relative to medium is not pinned
			// by a vector yet, so a known medium name after an unknown one is the medium.
			str := r.str()
			if m := mediumOf(str); m != MediumOther && ev.Medium == MediumOther && ev.Component != nil {
				ev.Medium = m
			} else {
				ev.Component = str
			}
		default:
			r.skip()
		}
	default:
		r.skip()
	}
}

// tokenIDs reads token_ids: an array of ids, or (SGLang with EAGLE) of [t, t_next] pairs,
// kept flattened in ev.Tokens. The first element says which; an element of the other
// kind makes the event invalid.
func (d *BatchDecoder) tokenIDs(ev *Event) {
	r := &d.r
	n := r.arrayLen()
	if n == 0 || r.err != nil {
		return
	}
	if c, _ := r.peek(); c&0xf0 == 0x90 {
		ev.Bigram = true
		for ; n > 0 && r.err == nil; n-- {
			if r.arrayLen() != 2 && r.err == nil {
				r.fail(errType)
				return
			}
			d.tokenID(ev)
			d.tokenID(ev)
		}
		return
	}
	// The common encodings (positive fixint, uint8/16/32) inline; the rest, errors
	// included, through tokenID. n is bounded by the bytes left (arrayLen).
	toks := slices.Grow(ev.Tokens, n)
	p, off := r.p, r.off
	for ; n > 0; n-- {
		if off >= len(p) {
			break
		}
		switch c := p[off]; {
		case c <= 0x7f:
			toks = append(toks, uint32(c))
			off++
			continue
		case c == 0xcd && off+2 < len(p):
			toks = append(toks, uint32(binary.BigEndian.Uint16(p[off+1:])))
			off += 3
			continue
		case c == 0xce && off+4 < len(p):
			toks = append(toks, binary.BigEndian.Uint32(p[off+1:]))
			off += 5
			continue
		case c == 0xcc && off+1 < len(p):
			toks = append(toks, uint32(p[off+1]))
			off += 2
			continue
		}
		r.off, ev.Tokens = off, toks
		d.tokenID(ev)
		if r.err != nil {
			return
		}
		toks, off = ev.Tokens, r.off
	}
	r.off, ev.Tokens = off, toks
	if n > 0 {
		r.fail(errShort)
	}
}

func (d *BatchDecoder) tokenID(ev *Event) {
	v, neg := d.r.int()
	if d.r.err != nil {
		return
	}
	if neg || v > 0xffffffff {
		d.r.fail(errRange)
		return
	}
	ev.Tokens = append(ev.Tokens, uint32(v))
}

// metadata reads SGLang's BlockStoredMetadata, a map: cache_salt is kept, other keys are
// skipped.
func (d *BatchDecoder) metadata(ev *Event) {
	r := &d.r
	if r.isNil() {
		return
	}
	n, isMap := r.container()
	if r.err == nil && !isMap {
		r.fail(errType)
	}
	for i := 0; i < n && r.err == nil; i++ {
		if string(r.str()) == "cache_salt" && !r.isNil() {
			ev.CacheSalt, ev.HasSalt = r.str(), true
		} else {
			r.skip()
		}
	}
}

func mediumOf(s []byte) Medium {
	switch {
	case bytes.EqualFold(s, []byte("GPU")):
		return MediumGPU
	case bytes.EqualFold(s, []byte("CPU")) || bytes.EqualFold(s, []byte("CPU_PINNED")):
		return MediumCPU
	case bytes.EqualFold(s, []byte("STORAGE")) || bytes.EqualFold(s, []byte("DISK")):
		return MediumStorage
	case bytes.EqualFold(s, []byte("EXTERNAL")):
		return MediumExternal
	}
	return MediumOther
}

// hash reads a block hash: an unsigned or signed integer (its 64-bit pattern) or a bin
// digest, of which vLLM publishes the last 8 bytes and SGLang the first 8, big-endian.
func (d *BatchDecoder) hash() uint64 {
	r := &d.r
	c, ok := r.peek()
	if !ok {
		return 0
	}
	if c == 0xc4 || c == 0xc5 || c == 0xc6 {
		b := r.str()
		if len(b) < 8 {
			r.fail(errType)
			return 0
		}
		if d.Engine == engine.SGLang {
			return binary.BigEndian.Uint64(b[:8])
		}
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	v, _ := r.int()
	return v
}
