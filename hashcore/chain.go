// Package hashcore turns token IDs into the block keys an engine publishes for its
// prefix cache, bit for bit, for every engine contract kvgate speaks.
//
// A key is the 64-bit value an engine puts in its KV events for one full block of
// tokens. Blocks chain: block i's digest covers block i-1's FULL digest, so a key
// depends on every token before it. Only full blocks have keys.
package hashcore

// Digest is a block's full digest, the value the next block chains on. N bytes of B are
// meaningful: 32 for SHA-256 contracts, 16 for XXH3-128, 8 for kvgate's fast key.
// A zero Digest (N == 0) means "no parent" where a contract has no root digest.
type Digest struct {
	B [32]byte
	N uint8
}

// Extras are the per-request inputs that enter a block's hash besides its tokens.
// The LoRA name enters every block; the cache salt enters block 0 only.
type Extras struct {
	LoRAName  string
	CacheSalt string
}

// Chain computes the block keys of one engine contract. Implementations are safe for
// concurrent use and allocate nothing per call in steady state.
type Chain interface {
	// Name is the contract's name as flags spell it, e.g. "vllm/sha256_cbor".
	Name() string
	// BlockSize is the number of tokens per block (page size for SGLang).
	BlockSize() int
	// Root is the parent digest of block 0 (vLLM's NONE_HASH; zero Digest where none).
	Root() Digest
	// AppendKeys appends the key of every full block of tokens to dst, chaining from
	// parent, and returns dst and the full digest of the last full block (parent when
	// tokens hold no full block). first says tokens[0] starts block 0 of the sequence,
	// so the cache salt applies to the first block; ex may be nil.
	AppendKeys(dst []uint64, parent Digest, tokens []uint32, ex *Extras, first bool) ([]uint64, Digest)
}

// Keys appends the keys of every full block of a whole prompt, from the chain's root.
func Keys(c Chain, dst []uint64, tokens []uint32, ex *Extras) []uint64 {
	dst, _ = c.AppendKeys(dst, c.Root(), tokens, ex, true)
	return dst
}
