package hashcore

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"

	"github.com/zeebo/xxh3"
)

// vllmChain is vLLM's prefix-cache block hash: digest(encode((parent, tuple(tokens),
// extra_keys))) chained on the parent's full digest, from NONE_HASH. The encoding is
// pickle protocol 5 (algos sha256, xxhash) or canonical CBOR (sha256_cbor, xxhash_cbor);
// the digest is SHA-256 (32 bytes) or XXH3-128 (16 bytes, big-endian). The published key
// is the digest's last 8 bytes, big-endian.
//
// XXH3 comes from github.com/zeebo/xxh3: a pure-Go port pinned to upstream's frozen v0.8
// output, with AVX2/AVX-512 kernels for long inputs, already used by other Go projects;
// the goldens check it against Python's xxhash (the C library vLLM uses).
type vllmChain struct {
	name      string
	blockSize int
	root      Digest
	pickle    bool // encoding: pickle (else CBOR)
	xxh       bool // digest: XXH3-128 (else SHA-256)
	cbor      cborBlockEncoder
}

func (c *vllmChain) Name() string   { return c.name }
func (c *vllmChain) BlockSize() int { return c.blockSize }
func (c *vllmChain) Root() Digest   { return c.root }

func (c *vllmChain) encodeSeed(dst []byte, seed string) []byte {
	if c.pickle {
		var p pickler
		return appendStrPickle(&p, dst, seed)
	}
	return appendCBORText(dst, seed)
}

func (c *vllmChain) digestOf(msg []byte) Digest {
	var d Digest
	if c.xxh {
		h := xxh3.Hash128(msg)
		binary.BigEndian.PutUint64(d.B[0:8], h.Hi)
		binary.BigEndian.PutUint64(d.B[8:16], h.Lo)
		d.N = 16
		return d
	}
	d.B = sha256.Sum256(msg)
	d.N = 32
	return d
}

// AppendKeys implements Chain. A zero parent means NONE_HASH. Extras failing
// ValidateExtras yield no keys.
func (c *vllmChain) AppendKeys(dst []uint64, parent Digest, tokens []uint32, ex *Extras, first bool) ([]uint64, Digest) {
	bs := c.blockSize
	nb := len(tokens) / bs
	if nb == 0 {
		return dst, parent
	}
	dst = slices.Grow(dst, nb)
	var lora, salt string
	if ex != nil {
		if ValidateExtras(ex) != nil {
			return dst, parent
		}
		lora = ex.LoRAName
		if first {
			salt = ex.CacheSalt
		}
	}
	if parent.N == 0 {
		parent = c.root
	}
	d := parent
	sc := getScratch()
	buf := sc.buf
	// The parts of a block message that repeat, encoded once: the extra keys (CBOR) or
	// everything after the token ints (pickle), for block 0 and for the blocks after it.
	var ex0, exN []byte
	pickleFast := false
	if c.pickle {
		sc.ex = appendPickleSuffix(sc.ex[:0], bs, lora, salt)
		n0 := len(sc.ex)
		sc.ex = appendPickleSuffix(sc.ex, bs, lora, "")
		ex0, exN = sc.ex[:n0], sc.ex[n0:]
		if pickleFast = pickleFits(int(d.N), bs, len(ex0)) && pickleFits(int(d.N), bs, len(exN)); pickleFast {
			buf = slices.Grow(buf[:0], pickleMaxLen(int(d.N), bs, max(len(ex0), len(exN)))+sha256PadSlack)
		}
	} else {
		sc.ex = appendCBORExtras(sc.ex[:0], lora, salt)
		n0 := len(sc.ex)
		sc.ex = appendCBORExtras(sc.ex, lora, "")
		ex0, exN = sc.ex[:n0], sc.ex[n0:]
		buf = slices.Grow(buf[:0], c.cbor.maxLen(bs, max(len(ex0), len(exN)))+sha256PadSlack)
	}
	for i := 0; i < nb; i++ {
		blk := tokens[i*bs : (i+1)*bs]
		switch {
		case pickleFast:
			buf = encodeBlockPickle(buf, &d, blk, ex0)
		case c.pickle: // blocks too big for one pickle frame
			buf = appendBlockPickle(&sc.pk, buf[:0], d.B[:d.N], blk, lora, salt)
			salt = ""
		default:
			buf = c.cbor.encode(buf, &d, blk, ex0)
		}
		ex0 = exN // the cache salt enters block 0 only
		var key uint64
		if c.xxh {
			h := xxh3.Hash128(buf)
			binary.BigEndian.PutUint64(d.B[0:8], h.Hi)
			binary.BigEndian.PutUint64(d.B[8:16], h.Lo)
			d.N = 16
			key = h.Lo
		} else {
			sha256Sum(&d.B, buf) // pads in place: buf has sha256PadSlack spare
			d.N = 32
			key = binary.BigEndian.Uint64(d.B[24:32])
		}
		dst = append(dst, key)
	}
	sc.buf = buf
	putScratch(sc)
	return dst, d
}
