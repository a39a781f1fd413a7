package hashcore

import (
	"encoding/binary"
	"slices"
)

// sglangChain is SGLang's page hash: SHA-256 over the parent page's raw 32-byte digest
// (nothing for the first page of an unsalted request) then each token as a little-endian
// uint32. The event value is the digest's first 8 bytes read big-endian as a signed
// int64; the key is those same 64 bits as uint64.
//
// A request's cache salt (Extras.CacheSalt) gives its first page a parent: the digest
// SHA-256("sglang-cache-salt-v1\x00" + salt). SGLang folds no LoRA name or other extra
// key into the page hash: ex.LoRAName is ignored.
//
// With bigram set (EAGLE speculative decoding) the radix key is the token bigrams
// [(t0,t1), (t1,t2), ...]: a page of blockSize bigrams covers blockSize+1 tokens and
// hashes both words of every pair. AppendKeys then takes plain tokens and hashes
// (len(tokens)-1)/blockSize pages; block i needs tokens [i*bs, (i+1)*bs] (one past its
// end), so a caller continuing a chain passes each block's tokens plus the next one.
type sglangChain struct {
	blockSize int
	bigram    bool
}

// sglangSaltPrefix is what SGLang hashes before a cache salt to seed its page chain.
const sglangSaltPrefix = "sglang-cache-salt-v1\x00"

func (c *sglangChain) Name() string {
	if c.bigram {
		return "sglang/sha256-bigram"
	}
	return "sglang/sha256"
}
func (c *sglangChain) BlockSize() int { return c.blockSize }

// HashesBigrams reports whether c keys pages by token bigrams (SGLang with EAGLE): its
// block i then needs tokens [i*bs, (i+1)*bs], one past the block.
func HashesBigrams(c Chain) bool {
	s, ok := c.(*sglangChain)
	return ok && s.bigram
}
func (c *sglangChain) Root() Digest { return Digest{} }

// sglangSaltDigest sets d to the parent digest of a salted request's first page.
func sglangSaltDigest(d *Digest, salt string, sc *scratch) {
	buf := slices.Grow(sc.buf[:0], len(sglangSaltPrefix)+len(salt)+sha256PadSlack)
	buf = append(append(buf, sglangSaltPrefix...), salt...)
	sha256Sum(&d.B, buf)
	d.N = 32
	sc.buf = buf
}

// AppendKeys implements Chain. A cache salt failing ValidateExtras yields no keys.
func (c *sglangChain) AppendKeys(dst []uint64, parent Digest, tokens []uint32, ex *Extras, first bool) ([]uint64, Digest) {
	bs := c.blockSize
	nb := len(tokens) / bs
	if c.bigram {
		nb = 0
		if len(tokens) > 0 {
			nb = (len(tokens) - 1) / bs
		}
	}
	if nb == 0 {
		return dst, parent
	}
	salted := first && ex != nil && ex.CacheSalt != ""
	if salted && checkString(ParamCacheSalt, "cache salt", ex.CacheSalt) != nil {
		return dst, parent
	}
	dst = slices.Grow(dst, nb)
	d := parent
	sc := getScratch()
	if salted {
		sglangSaltDigest(&d, ex.CacheSalt, sc)
	}
	words := bs
	if c.bigram {
		words = 2 * bs
	}
	buf := slices.Grow(sc.buf[:0], 32+4*words+sha256PadSlack) // sha256Sum pads in place
	for i := 0; i < nb; i++ {
		if !c.bigram && useSHA256Blocks && d.N == 32 {
			if loop := pickFusedLoop(bs, 0, fusedSlot(32+4*bs, 0)); loop != fusedNone {
				dst = c.appendKeysFused(dst, &d, tokens[i*bs:nb*bs], sc, loop)
				break
			}
		}
		if useSHA256Blocks && d.N == 32 {
			// The block function takes the parent from d.B: buf[:32] is only its slot.
			buf = c.appendPage(buf[:32], tokens, i)
			sha256ChainAt0(&d.B, sha256Pad(buf, len(buf)))
		} else {
			buf = append(buf[:0], d.B[:d.N]...)
			buf = c.appendPage(buf, tokens, i)
			sha256Sum(&d.B, buf)
		}
		d.N = 32
		dst = append(dst, binary.BigEndian.Uint64(d.B[0:8]))
	}
	sc.buf = buf
	putScratch(sc)
	return dst, d
}

// appendPage appends page i's words: its tokens, or (bigram) both tokens of each of its
// pairs, as little-endian uint32s.
func (c *sglangChain) appendPage(buf []byte, tokens []uint32, i int) []byte {
	bs := c.blockSize
	if !c.bigram {
		return appendUint32sLE(buf, tokens[i*bs:(i+1)*bs])
	}
	page := tokens[i*bs : (i+1)*bs+1]
	n := len(buf)
	buf = slices.Grow(buf, 8*bs)[:n+8*bs] // AppendKeys reserved it: no copy
	w := buf[n : n+8*bs]
	for j := 0; j < bs; j++ {
		binary.LittleEndian.PutUint32(w[8*j:], page[j])
		binary.LittleEndian.PutUint32(w[8*j+4:], page[j+1])
	}
	return buf
}

// appendKeysFused hashes pages chained on the 32-byte digest d in one call of the
// fused assembly loop loop (see vllmChain.appendKeysFused).
func (c *sglangChain) appendKeysFused(dst []uint64, d *Digest, tokens []uint32, sc *scratch, loop fusedLoop) []uint64 {
	bs := c.blockSize
	nb := len(tokens) / bs
	plan := sha256FusedPlan{prefixLen: 32, tokBytes: 4 * uint64(bs)}
	plan.pad[0] = 0x80
	slot := fusedSlot(32+4*bs, 0)
	buf := slices.Grow(sc.batch[:0], 2*slot)[:2*slot]
	first := appendUint32sLE(buf[:32:slot], tokens[:bs]) // buf[:32] is the parent's slot
	blocks0 := len(sha256Pad(first, len(first))) >> 6
	next := &tokens[0]
	if nb > 1 {
		next = &tokens[bs]
	}
	keys := dst[len(dst) : len(dst)+nb]
	if loop == fusedAVX512 {
		sha256ChainSGLangAVX512(&d.B, &plan, &buf[0], slot, blocks0, next, &keys[0], nb)
	} else {
		sha256ChainSGLangScalar(&d.B, &plan, &buf[0], slot, blocks0, next, &keys[0], nb)
	}
	sc.batch = buf[:0]
	return dst[:len(dst)+nb]
}
