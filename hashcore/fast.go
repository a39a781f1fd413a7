package hashcore

import (
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// fastChain is kvgate's own key, used where kvgate re-hashes an engine's stored tokens
// (TensorRT-LLM events, parity fallback) and never compared with an engine's value:
//
//	key(i) = XXH3-64(tokens of block i as little-endian uint32s, seed = key(i-1) ^ mix)
//
// with key(-1) = 0, mix = XXH3-64(LoRA name, seed loraDomain) on every block when a LoRA
// name is set, xor XXH3-64(cache salt, seed saltDomain) on block 0. The digest is the key
// (8 bytes, big-endian). One short XXH3 per block, no encoding: far cheaper than SHA-256.
type fastChain struct {
	blockSize int
}

// Domain seeds keep a LoRA name and a cache salt with equal text from mixing alike.
const (
	fastLoRADomain = 0x6b76676174652f6c // "kvgate/l"
	fastSaltDomain = 0x6b76676174652f73 // "kvgate/s"
)

// NewFast returns kvgate's fast chain ("kvgate/fast"). blockSize < 1 is treated as 1.
func NewFast(blockSize int) Chain {
	if blockSize < 1 {
		blockSize = 1
	}
	return &fastChain{blockSize: blockSize}
}

func (c *fastChain) Name() string   { return "kvgate/fast" }
func (c *fastChain) BlockSize() int { return c.blockSize }
func (c *fastChain) Root() Digest   { return Digest{} }

// AppendKeys implements Chain.
func (c *fastChain) AppendKeys(dst []uint64, parent Digest, tokens []uint32, ex *Extras, first bool) ([]uint64, Digest) {
	bs := c.blockSize
	nb := len(tokens) / bs
	if nb == 0 {
		return dst, parent
	}
	dst = slices.Grow(dst, nb)
	var loraMix, saltMix uint64
	if ex != nil {
		if ex.LoRAName != "" {
			loraMix = xxh3.HashStringSeed(ex.LoRAName, fastLoRADomain)
		}
		if first && ex.CacheSalt != "" {
			saltMix = xxh3.HashStringSeed(ex.CacheSalt, fastSaltDomain)
		}
	}
	var key uint64
	if parent.N != 0 {
		key = binary.BigEndian.Uint64(parent.B[0:8])
	}
	var sc *scratch
	if !littleEndian {
		sc = getScratch()
	}
	for i := 0; i < nb; i++ {
		blk := tokens[i*bs : (i+1)*bs]
		var msg []byte
		if littleEndian {
			msg = unsafe.Slice((*byte)(unsafe.Pointer(&blk[0])), 4*len(blk))
		} else {
			sc.buf = appendUint32sLE(sc.buf[:0], blk)
			msg = sc.buf
		}
		key = xxh3.HashSeed(msg, key^loraMix^saltMix)
		saltMix = 0 // the cache salt enters block 0 only
		dst = append(dst, key)
	}
	if sc != nil {
		putScratch(sc)
	}
	var d Digest
	binary.BigEndian.PutUint64(d.B[0:8], key)
	d.N = 8
	return dst, d
}
