package hashcore

import (
	"encoding/binary"
	"slices"
)

// sglangChain is SGLang's page hash: SHA-256 over the parent page's raw 32-byte digest
// (nothing for the first page) then each token as a little-endian uint32. The event value
// is the digest's first 8 bytes read big-endian as a signed int64; the key is those same
// 64 bits as uint64. SGLang's hash has no seed and no extra keys: ex is ignored.
type sglangChain struct {
	blockSize int
}

func (c *sglangChain) Name() string   { return "sglang/sha256" }
func (c *sglangChain) BlockSize() int { return c.blockSize }
func (c *sglangChain) Root() Digest   { return Digest{} }

// AppendKeys implements Chain.
func (c *sglangChain) AppendKeys(dst []uint64, parent Digest, tokens []uint32, _ *Extras, _ bool) ([]uint64, Digest) {
	bs := c.blockSize
	nb := len(tokens) / bs
	if nb == 0 {
		return dst, parent
	}
	dst = slices.Grow(dst, nb)
	d := parent
	sc := getScratch()
	buf := slices.Grow(sc.buf[:0], 32+4*bs+sha256PadSlack) // sha256Sum pads in place
	for i := 0; i < nb; i++ {
		if useSHA256Fused && useSHA256Blocks && useTokensAVX512 && bs%4 == 0 && d.N == 32 {
			dst = c.appendKeysFused(dst, &d, tokens[i*bs:nb*bs], sc)
			break
		}
		blk := tokens[i*bs : (i+1)*bs]
		if useSHA256Blocks && d.N == 32 {
			// The block function takes the parent from d.B: buf[:32] is only its slot.
			buf = appendUint32sLE(buf[:32], blk)
			sha256ChainAt0(&d.B, sha256Pad(buf, len(buf)))
		} else {
			buf = append(buf[:0], d.B[:d.N]...)
			buf = appendUint32sLE(buf, blk)
			sha256Sum(&d.B, buf)
		}
		d.N = 32
		dst = append(dst, binary.BigEndian.Uint64(d.B[0:8]))
	}
	sc.buf = buf
	putScratch(sc)
	return dst, d
}

// appendKeysFused hashes pages of a multiple of 4 tokens chained on the 32-byte
// digest d in one call of the fused assembly loop (see vllmChain.appendKeysFused);
// needs haveSHA256Fused.
func (c *sglangChain) appendKeysFused(dst []uint64, d *Digest, tokens []uint32, sc *scratch) []uint64 {
	bs := c.blockSize
	nb := len(tokens) / bs
	plan := sha256FusedPlan{prefixLen: 32, tokBytes: 4 * uint64(bs)}
	plan.pad[0] = 0x80
	slot := (32 + 4*bs + 72 + 63) &^ 63
	buf := slices.Grow(sc.batch[:0], 2*slot)[:2*slot]
	first := appendUint32sLE(buf[:32:slot], tokens[:bs]) // buf[:32] is the parent's slot
	blocks0 := len(sha256Pad(first, len(first))) >> 6
	next := &tokens[0]
	if nb > 1 {
		next = &tokens[bs]
	}
	keys := dst[len(dst) : len(dst)+nb]
	sha256ChainSGLangAVX512(&d.B, &plan, &buf[0], slot, blocks0, next, &keys[0], nb)
	sc.batch = buf[:0]
	return dst[:len(dst)+nb]
}
