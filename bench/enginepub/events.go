// Package enginepub publishes KV-cache events the way inference engines do: vLLM and
// SGLang over ZeroMQ (PUB + optional ROUTER replay, msgpack batches in array or map
// layout) and TensorRT-LLM's destructive /kv_cache_events drain. kvgate's tests and its
// engine simulator use it; it is written from the contracts in CONTRACTS.md, not from
// kvgate's decoder.
package enginepub

import "encoding/binary"

// Event is one KV-cache event: BlockStored, BlockRemoved or AllBlocksCleared.
type Event interface{ isEvent() }

// BlockStored announces newly cached full blocks. Hashes are the engine's 64-bit keys
// (SGLang's signed values are passed as their uint64 bit pattern).
type BlockStored struct {
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	TokenIDs  []uint32
	BlockSize int
	LoRAName  string
	Medium    string // "" = GPU (written as nil where the field is optional)
	// CacheSalt (SGLang, HasSalt) makes the store SGLang's BlockStoredWithMetadata: the
	// metadata map {"cache_salt": s} follows medium.
	CacheSalt string
	HasSalt   bool
	// Bigram (SGLang with EAGLE): TokenIDs are the plain tokens, one more than the pairs
	// (BlockSize pairs per block); token_ids is written as [[t0,t1],[t1,t2],...].
	Bigram bool
}

// BlockRemoved announces evicted blocks.
type BlockRemoved struct {
	Hashes []uint64
	Medium string
}

// AllBlocksCleared follows a prefix-cache reset.
type AllBlocksCleared struct{}

func (BlockStored) isEvent()      {}
func (BlockRemoved) isEvent()     {}
func (AllBlocksCleared) isEvent() {}

// Flavor selects the engine whose wire format is spoken.
type Flavor uint8

const (
	VLLM Flavor = iota
	SGLang
)

// Layout selects how events are encoded inside a batch.
type Layout uint8

const (
	LayoutArray Layout = iota // [tag, field...]
	LayoutMap                 // {"type": tag, field: value...} in an array batch
	// LayoutMapBatch is current vLLM's (EventBatch without array_like): the batch is
	// {"ts", "events", "data_parallel_rank"} too, events as in LayoutMap.
	LayoutMapBatch
)

// HashEncoding selects how hash values are written.
type HashEncoding uint8

const (
	HashUint  HashEncoding = iota // msgpack uint (0xcf when >= 2^63); SGLang flavour writes signed
	HashInt64                     // msgpack int64 (0xd3), as old engines wrote them
	HashBin                       // 32-byte bin digest carrying the key (last 8 bytes BE for vLLM, first 8 for SGLang)
)

// Format fixes every wire choice of a publisher.
type Format struct {
	Flavor Flavor
	Layout Layout
	// StoredFields is the number of BlockStored fields after the tag in the array layout
	// (vLLM: 5 = v0.9, 6 adds medium, 7 adds lora_name, up to 11; SGLang: 6). 0 = all.
	StoredFields int
	// RemovedFields is the number of BlockRemoved fields after the tag (1..3). 0 = all.
	RemovedFields int
	Hashes        HashEncoding
	NoDPRank      bool // v0.9 batches: [ts, events] without the rank
	DPRank        int
}

var storedNames = [...]string{"block_hashes", "parent_block_hash", "token_ids", "block_size",
	"lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
	"kv_cache_spec_sliding_window"}

func (f *Format) storedFields() int {
	max := len(storedNames)
	if f.Flavor == SGLang {
		max = 6
	}
	if f.StoredFields <= 0 || f.StoredFields > max {
		return max
	}
	return f.StoredFields
}

func (f *Format) removedFields() int {
	max := 3
	if f.Flavor == SGLang {
		max = 2
	}
	if f.RemovedFields <= 0 || f.RemovedFields > max {
		return max
	}
	return f.RemovedFields
}

func (f *Format) appendHash(b []byte, h uint64) []byte {
	switch f.Hashes {
	case HashInt64:
		return appendInt64Wide(b, int64(h))
	case HashBin:
		var d [32]byte
		if f.Flavor == SGLang {
			binary.BigEndian.PutUint64(d[:8], h)
			for i := 8; i < 32; i++ {
				d[i] = byte(i)
			}
		} else {
			for i := 0; i < 24; i++ {
				d[i] = byte(0xa0 + i)
			}
			binary.BigEndian.PutUint64(d[24:], h)
		}
		return appendBin(b, d[:])
	}
	if f.Flavor == SGLang {
		return appendInt(b, int64(h))
	}
	return appendUint(b, h)
}

func (f *Format) appendHashes(b []byte, hs []uint64) []byte {
	b = appendArrayHeader(b, len(hs))
	for _, h := range hs {
		b = f.appendHash(b, h)
	}
	return b
}

func appendMedium(b []byte, m string) []byte {
	if m == "" {
		return appendNil(b)
	}
	return appendStr(b, m)
}

// AppendBatch appends the msgpack payload of one batch [ts, [event...], dp_rank] (or,
// LayoutMapBatch, its map).
func (f *Format) AppendBatch(b []byte, ts float64, events []Event) []byte {
	if f.Layout == LayoutMapBatch {
		n := 3
		if f.NoDPRank {
			n = 2
		}
		b = appendMapHeader(b, n)
		b = appendStr(b, "ts")
		b = appendFloat64(b, ts)
		b = appendStr(b, "events")
		b = appendArrayHeader(b, len(events))
		for _, ev := range events {
			b = f.appendEvent(b, ev)
		}
		if !f.NoDPRank {
			b = appendStr(b, "data_parallel_rank")
			b = appendInt(b, int64(f.DPRank))
		}
		return b
	}
	if f.NoDPRank {
		b = appendArrayHeader(b, 2)
	} else {
		b = appendArrayHeader(b, 3)
	}
	b = appendFloat64(b, ts)
	b = appendArrayHeader(b, len(events))
	for _, ev := range events {
		b = f.appendEvent(b, ev)
	}
	if !f.NoDPRank {
		b = appendInt(b, int64(f.DPRank))
	}
	return b
}

func (f *Format) appendStoredField(b []byte, i int, e *BlockStored) []byte {
	switch i {
	case 0:
		return f.appendHashes(b, e.Hashes)
	case 1:
		if !e.HasParent {
			return appendNil(b)
		}
		return f.appendHash(b, e.Parent)
	case 2:
		if e.Bigram {
			n := max(len(e.TokenIDs)-1, 0)
			b = appendArrayHeader(b, n)
			for j := 0; j < n; j++ {
				b = appendArrayHeader(b, 2)
				b = appendUint(b, uint64(e.TokenIDs[j]))
				b = appendUint(b, uint64(e.TokenIDs[j+1]))
			}
			return b
		}
		b = appendArrayHeader(b, len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			b = appendUint(b, uint64(t))
		}
		return b
	case 3:
		return appendInt(b, int64(e.BlockSize))
	case 4:
		return appendNil(b) // lora_id
	case 5:
		return appendMedium(b, e.Medium)
	case 6:
		if e.LoRAName == "" {
			return appendNil(b)
		}
		return appendStr(b, e.LoRAName)
	default:
		return appendNil(b) // extra_keys, group_idx, kv_cache_spec_*
	}
}

func (f *Format) appendEvent(b []byte, ev Event) []byte {
	switch e := ev.(type) {
	case BlockStored:
		return f.appendStored(b, &e)
	case *BlockStored:
		return f.appendStored(b, e)
	case BlockRemoved:
		return f.appendRemoved(b, &e)
	case *BlockRemoved:
		return f.appendRemoved(b, e)
	case AllBlocksCleared, *AllBlocksCleared:
		if f.Layout != LayoutArray {
			b = appendMapHeader(b, 1)
			b = appendStr(b, "type")
			return appendStr(b, "AllBlocksCleared")
		}
		b = appendArrayHeader(b, 1)
		return appendStr(b, "AllBlocksCleared")
	}
	return appendNil(b)
}

func appendSaltMetadata(b []byte, salt string) []byte {
	b = appendMapHeader(b, 1)
	b = appendStr(b, "cache_salt")
	return appendStr(b, salt)
}

func (f *Format) appendStored(b []byte, e *BlockStored) []byte {
	salted := f.Flavor == SGLang && e.HasSalt
	if f.Layout != LayoutArray {
		// Null defaults (extra_keys, group_idx, kv_cache_spec_*) are omitted, as msgspec does.
		n := 7
		if f.Flavor == SGLang {
			n = 6
		}
		m := n + 1
		if salted {
			m++
		}
		b = appendMapHeader(b, m)
		b = appendStr(b, "type")
		b = appendStr(b, "BlockStored")
		for i := 0; i < n; i++ {
			b = appendStr(b, storedNames[i])
			b = f.appendStoredField(b, i, e)
		}
		if salted {
			b = appendStr(b, "metadata")
			b = appendSaltMetadata(b, e.CacheSalt)
		}
		return b
	}
	n := f.storedFields()
	if salted {
		b = appendArrayHeader(b, n+2)
	} else {
		b = appendArrayHeader(b, n+1)
	}
	b = appendStr(b, "BlockStored")
	for i := 0; i < n; i++ {
		b = f.appendStoredField(b, i, e)
	}
	if salted {
		b = appendSaltMetadata(b, e.CacheSalt)
	}
	return b
}

func (f *Format) appendRemoved(b []byte, e *BlockRemoved) []byte {
	if f.Layout != LayoutArray {
		b = appendMapHeader(b, 3)
		b = appendStr(b, "type")
		b = appendStr(b, "BlockRemoved")
		b = appendStr(b, "block_hashes")
		b = f.appendHashes(b, e.Hashes)
		b = appendStr(b, "medium")
		return appendMedium(b, e.Medium)
	}
	n := f.removedFields()
	b = appendArrayHeader(b, n+1)
	b = appendStr(b, "BlockRemoved")
	b = f.appendHashes(b, e.Hashes)
	if n >= 2 {
		b = appendMedium(b, e.Medium)
	}
	if n >= 3 {
		b = appendNil(b) // group_idx
	}
	return b
}
