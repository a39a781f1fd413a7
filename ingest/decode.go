package ingest

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// Flavor is the engine family whose wire conventions a decoder applies.
type Flavor uint8

const (
	FlavorVLLM Flavor = iota
	FlavorSGLang
)

// EventKind is the type of one decoded event.
type EventKind uint8

const (
	EventUnknown EventKind = iota
	EventStored
	EventRemoved
	EventCleared
)

// Medium is the cache tier an event refers to.
type Medium uint8

const (
	MediumGPU Medium = iota
	MediumCPU
	MediumStorage
	MediumOther
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
	}
	return "OTHER"
}

// Event is one decoded event. Its slices point into the decoder's reused buffers or the
// payload: they are valid until the next call to Next.
type Event struct {
	Kind      EventKind
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	Tokens    []uint32
	BlockSize int
	Medium    Medium
	LoRAName  []byte
	// ExtraKeys holds the raw msgpack of extra_keys when present and not null.
	ExtraKeys []byte
}

var errBatch = errors.New("ingest: batch is not [ts, [events...], dp_rank]")

// BatchDecoder walks one msgpack batch [ts, [event...], (dp_rank)] event by event,
// decoding into reused buffers: after warm-up it allocates nothing.
type BatchDecoder struct {
	Flavor Flavor
	r      reader
	outer  int // elements in the batch array
	left   int // events not yet read
	ts     float64
	hashes []uint64
	tokens []uint32
}

// Reset starts decoding payload.
func (d *BatchDecoder) Reset(payload []byte) error {
	d.r.reset(payload)
	d.outer = d.r.arrayLen()
	if d.r.err == nil && d.outer < 2 {
		d.r.fail(errBatch)
	}
	d.ts = d.r.float()
	d.left = d.r.arrayLen()
	if d.r.err != nil {
		d.left = 0
		return d.r.err
	}
	return nil
}

// Timestamp is the batch's ts.
func (d *BatchDecoder) Timestamp() float64 { return d.ts }

// Err is the first decoding error, if any.
func (d *BatchDecoder) Err() error { return d.r.err }

// Finish reads what follows the events: the data-parallel rank (-1 when absent).
func (d *BatchDecoder) Finish() (dpRank int, err error) {
	for d.left > 0 && d.r.err == nil {
		d.left--
		d.r.skip()
	}
	dpRank = -1
	if d.r.err == nil && d.outer >= 3 {
		if !d.r.isNil() {
			v, _ := d.r.int()
			dpRank = int(int64(v))
		}
		for i := 3; i < d.outer && d.r.err == nil; i++ {
			d.r.skip()
		}
	}
	return dpRank, d.r.err
}

// Next decodes the next event into ev. It returns false at the end of the events or on a
// malformed payload (see Err). An event of an unknown type comes back as EventUnknown.
func (d *BatchDecoder) Next(ev *Event) bool {
	if d.left <= 0 || d.r.err != nil {
		return false
	}
	d.left--
	*ev = Event{Hashes: d.hashes[:0], Tokens: d.tokens[:0]}
	n, isMap := d.r.container()
	if d.r.err != nil {
		return false
	}
	if isMap {
		d.decodeMap(ev, n)
	} else {
		d.decodeArray(ev, n)
	}
	// Keep the grown buffers for the next event.
	d.hashes, d.tokens = ev.Hashes[:0], ev.Tokens[:0]
	return d.r.err == nil
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

// Field numbers, in the order both layouts use.
const (
	fHashes = iota
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fOther
)

var removedFields = [...]int{fHashes, fMedium}

func (d *BatchDecoder) decodeArray(ev *Event, n int) {
	if n == 0 {
		d.r.fail(errType)
		return
	}
	tag := d.r.str()
	ev.Kind = kindOf(tag)
	for i := 0; i < n-1 && d.r.err == nil; i++ {
		f := fOther
		switch ev.Kind {
		case EventStored:
			if i < fOther {
				f = i
			}
		case EventRemoved:
			if i < len(removedFields) {
				f = removedFields[i]
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
		for k := r.arrayLen(); k > 0 && r.err == nil; k-- {
			v, neg := r.int()
			if neg || v > 0xffffffff {
				r.fail(errType)
				return
			}
			ev.Tokens = append(ev.Tokens, uint32(v))
		}
	case fBlockSize:
		if r.isNil() {
			return
		}
		v, neg := r.int()
		if neg || v > 1<<20 {
			r.fail(errType)
			return
		}
		ev.BlockSize = int(v)
	case fMedium:
		if r.isNil() {
			return
		}
		ev.Medium = mediumOf(r.str())
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
	default:
		r.skip()
	}
}

func mediumOf(s []byte) Medium {
	switch {
	case bytes.EqualFold(s, []byte("GPU")):
		return MediumGPU
	case bytes.EqualFold(s, []byte("CPU")):
		return MediumCPU
	case bytes.EqualFold(s, []byte("STORAGE")) || bytes.EqualFold(s, []byte("DISK")):
		return MediumStorage
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
		if d.Flavor == FlavorSGLang {
			return binary.BigEndian.Uint64(b[:8])
		}
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	v, _ := r.int()
	return v
}
