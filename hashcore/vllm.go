package hashcore

import (
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

// digestOf is the digest of one block message.
func (c *vllmChain) digestOf(msg []byte) Digest {
	var d Digest
	c.digestInto(&d, msg)
	return d
}

// digestInto sets d to the digest of one block message and returns the block's key. A
// SHA-256 message with sha256PadSlack bytes of spare capacity is padded in place there
// (sha256Sum).
func (c *vllmChain) digestInto(d *Digest, msg []byte) (key uint64) {
	if c.xxh {
		h := xxh3.Hash128(msg)
		binary.BigEndian.PutUint64(d.B[0:8], h.Hi)
		binary.BigEndian.PutUint64(d.B[8:16], h.Lo)
		d.N = 16
		return h.Lo
	}
	sha256Sum(&d.B, msg)
	d.N = 32
	return vllmKey(d)
}

// vllmKey is the key vLLM publishes for a block of a SHA-256 chain: the digest's last 8
// bytes, big-endian (XXH3-128's low half, for xxhash chains, digestInto returns).
func vllmKey(d *Digest) uint64 { return binary.BigEndian.Uint64(d.B[24:32]) }

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
	pn := max(int(d.N), 32) // parent length bound: block 0's parent, then this chain's digests
	pickleFast := false
	blockCap := 0 // one block message's bytes at most, padding included (pipelined)
	if c.pickle {
		sc.ex = appendPickleSuffix(sc.ex[:0], bs, lora, salt)
		n0 := len(sc.ex)
		sc.ex = appendPickleSuffix(sc.ex, bs, lora, "")
		ex0, exN = sc.ex[:n0], sc.ex[n0:]
		if pickleFast = pickleFits(pn, bs, len(ex0)) && pickleFits(pn, bs, len(exN)); pickleFast {
			blockCap = pickleMaxLen(pn, bs, max(len(ex0), len(exN))) + sha256PadSlack
			buf = slices.Grow(buf[:0], blockCap)
		}
	} else {
		sc.ex = appendCBORExtras(sc.ex[:0], lora, salt)
		n0 := len(sc.ex)
		sc.ex = appendCBORExtras(sc.ex, lora, "")
		ex0, exN = sc.ex[:n0], sc.ex[n0:]
		blockCap = c.cbor.maxLen(bs, max(len(ex0), len(exN))) + sha256PadSlack
		buf = slices.Grow(buf[:0], blockCap)
	}
	// SHA-256 blocks chained on a 32-byte digest go through kvgate's block function,
	// pipelined (appendKeysSHA256); block 0 may chain on a parent of another size.
	pipelined := !c.xxh && useSHA256Blocks && (pickleFast || !c.pickle)
	for i := 0; i < nb; i++ {
		if pipelined && d.N == 32 {
			prefixLen, tokMax := c.fusedLayout()
			slot := fusedSlot(prefixLen+tokMax*bs, max(len(ex0), len(exN)))
			if loop := pickFusedLoop(bs, len(exN), slot); loop != fusedNone {
				dst = c.appendKeysFused(dst, &d, tokens[i*bs:nb*bs], ex0, exN, sc, loop, slot)
			} else {
				dst = c.appendKeysSHA256(dst, &d, tokens[i*bs:nb*bs], ex0, exN, sc, blockCap)
			}
			break
		}
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
		ex0 = exN                                // the cache salt enters block 0 only
		dst = append(dst, c.digestInto(&d, buf)) // buf has sha256PadSlack spare
	}
	sc.buf = buf
	putScratch(sc)
	return dst, d
}

// appendKeysSHA256 appends the keys of the blocks of tokens (a whole number of blocks,
// at least one), the first chained on d, a 32-byte digest, and leaves the last digest in
// d. ex0 is the first block's extras (pickle: suffix), exN the later blocks'; blockCap
// bounds one block's message with its padding (the chain's block capacity plus
// sha256PadSlack). The messages go into sc.batch.
//
// Each message is written, with its SHA-256 padding, before the previous block's
// digest is known: the block function reads the parent digest from d itself, so the
// encoding depends on no digest. Why a run of sha256Run messages first, then their
// hashes, and not each message one block ahead: a block's SHA rounds are a latency
// chain long enough to fill the out-of-order window, so a message written after them in
// program order mostly waited for the rounds to drain rather than running in their
// shadow. Written in a loop of their own the writes run at their throughput and the hash
// loop is the SHA latency chain with little between the calls: ~4% less CPU for an
// 8,192-token prompt on a CPU without the fused AVX-512 loop (bench/RESULTS.md, Session 7;
// the writes are still about a third of the chain there).
func (c *vllmChain) appendKeysSHA256(dst []uint64, d *Digest, tokens []uint32, ex0, exN []byte, sc *scratch, blockCap int) []uint64 {
	bs := c.blockSize
	// A slot holds one message of blockCap bytes (its padding included), rounded up to
	// whole cache lines so messages do not share them.
	slot := (blockCap + 63) &^ 63
	// Room for a whole run whatever this call's length, so a pooled scratch grows once,
	// not again at each longer prompt; huge blocks take fewer messages a run.
	run := min(max(sha256RunBytes/slot, 1), sha256Run)
	sc.batch = slices.Grow(sc.batch[:0], run*slot)[:run*slot]
	var lens [sha256Run]int32
	ex := ex0
	for i := 0; i < len(tokens); {
		n := min((len(tokens)-i)/bs, run)
		for j := 0; j < n; j++ {
			lens[j] = int32(len(c.encodeAround32(sc.batch[j*slot:j*slot:(j+1)*slot], tokens[i+j*bs:i+(j+1)*bs], ex)))
			ex = exN // the cache salt enters block 0 only
		}
		for j := 0; j < n; j++ {
			msg := sc.batch[j*slot : j*slot+int(lens[j])]
			if c.pickle {
				sha256ChainAt13(&d.B, msg)
			} else {
				sha256ChainAt3(&d.B, msg)
			}
			dst = append(dst, vllmKey(d))
		}
		i += n * bs
	}
	return dst
}

// sha256Run is how many block messages appendKeysSHA256 writes before hashing them:
// enough that the writes run as one loop of their own, few enough that they stay in L1
// (sha256RunBytes at most; 8 KiB for 16-token blocks) and are not all written before
// the first is hashed.
const (
	sha256Run      = 32
	sha256RunBytes = 16 << 10
)

// encodeAround32 writes a block message with room for a 32-byte parent digest, and its
// SHA-256 padding, into buf and returns the padded message.
func (c *vllmChain) encodeAround32(buf []byte, tokens []uint32, extras []byte) []byte {
	var n int
	if c.pickle {
		n = encodeAroundPickle32(buf, tokens, extras)
	} else {
		n = c.cbor.encodeAround32(buf, tokens, extras)
	}
	return sha256Pad(buf, n)
}

// fusedLayout returns where the tokens of a block message chained on a 32-byte digest
// start, and the most bytes a token takes.
func (c *vllmChain) fusedLayout() (prefixLen, tokMax int) {
	if c.pickle {
		prefixLen = pickleParent32At + 33 // the parent, MEMOIZE
		if c.blockSize > 3 {
			prefixLen++ // MARK
		}
		return prefixLen, 7
	}
	return cborParent32At + 32 + c.cbor.tokHeadN, 5
}

// appendKeysFused is appendKeysSHA256 on CPUs with a fused assembly loop (loop, from
// pickFusedLoop): the first block's message is written here, every later one by the
// assembly loop itself, which hashes the whole run in one call, in slots of slot bytes.
func (c *vllmChain) appendKeysFused(dst []uint64, d *Digest, tokens []uint32, ex0, exN []byte, sc *scratch, loop fusedLoop, slot int) []uint64 {
	bs := c.blockSize
	nb := len(tokens) / bs
	var plan sha256FusedPlan
	prefixLen, _ := c.fusedLayout()
	if c.pickle {
		plan.prefix[0], plan.prefix[1], plan.prefix[2] = pkProto, 5, pkFrame
		plan.prefix[11], plan.prefix[12] = pkShortBinBytes, 32
		plan.prefix[pickleParent32At+32], plan.prefix[pickleParent32At+33] = pkMemoize, pkMark // MARK: bs > 3
	} else {
		plan.prefix[0], plan.prefix[1], plan.prefix[2] = 0x83, 0x58, 32
		binary.LittleEndian.PutUint64(plan.prefix[cborParent32At+32:], c.cbor.tokHeadWord)
	}
	copy(plan.extras[:], exN)
	plan.pad[0] = 0x80
	plan.prefixLen, plan.extrasLen = uint64(prefixLen), uint64(len(exN))
	plan.tokBytes = 4 * uint64(bs)
	buf := slices.Grow(sc.batch[:0], 2*slot)[:2*slot]
	blocks0 := len(c.encodeAround32(buf[:slot:slot], tokens[:bs], ex0)) >> 6
	next := &tokens[0]
	if nb > 1 {
		next = &tokens[bs]
	}
	keys := dst[len(dst) : len(dst)+nb]
	switch {
	case loop == fusedAVX512 && c.pickle:
		sha256ChainPickleAVX512(&d.B, &plan, &buf[0], slot, blocks0, next, &keys[0], nb)
	case loop == fusedAVX512:
		sha256ChainCBORAVX512(&d.B, &plan, &buf[0], slot, blocks0, next, &keys[0], nb)
	case c.pickle:
		sha256ChainPickleScalar(&d.B, &plan, &buf[0], slot, blocks0, next, &keys[0], nb)
	default:
		sha256ChainCBORScalar(&d.B, &plan, &buf[0], slot, blocks0, next, &keys[0], nb)
	}
	sc.batch = buf[:0]
	return dst[:len(dst)+nb]
}
