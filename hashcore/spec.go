package hashcore

import (
	"fmt"
	"unicode/utf8"

	"github.com/kvgate/kvgate/engine"
)

// DefaultNoneHashSeed is the seed vLLM derives NONE_HASH from for its cryptographic algos
// (sha256, sha256_cbor) when PYTHONHASHSEED is unset (kv_cache_utils.DEFAULT_NONE_HASH_SEED,
// vLLM after mid-2026; older engines used 32 random bytes, which no router can match).
const DefaultNoneHashSeed = "vllm-none-hash"

// MaxBlockSize bounds Spec.BlockSize; real engines use 1..a few thousand tokens.
const MaxBlockSize = 1 << 20

// MaxStringLen bounds the seed, LoRA name and cache salt in bytes. Longer strings are
// written outside pickle frames by CPython, a layout kvgate does not reproduce.
const MaxStringLen = 64*1024 - 1

// Kvgate names kvgate's own key contract (NewFast) in Spec.Engine. No engine hashes
// with it: it keys what kvgate re-hashes itself (TensorRT-LLM, -kv-keys rehash).
const Kvgate engine.Kind = "kvgate"

// The contract parameters a ParamError blames: Spec's fields and Extras' strings.
const (
	ParamEngine    = "engine"
	ParamAlgo      = "algo"
	ParamBlockSize = "block_size"
	ParamSeed      = "seed"
	ParamBigram    = "bigram"
	ParamLoRAName  = "lora_name"
	ParamCacheSalt = "cache_salt"
)

// ParamError is a contract parameter kvgate cannot match. Param names it (one of the
// Param constants), so a caller names its own flag or field without reading Msg.
type ParamError struct {
	Param string
	Msg   string // the whole message, "hashcore: ..."
}

func (e *ParamError) Error() string { return e.Msg }

func paramError(param, format string, a ...any) error {
	return &ParamError{Param: param, Msg: fmt.Sprintf(format, a...)}
}

// Spec names one engine contract and its parameters.
type Spec struct {
	Engine    engine.Kind // engine.VLLM | engine.SGLang | Kvgate
	Algo      string      // vllm: "sha256" (default) | "sha256_cbor" | "xxhash" | "xxhash_cbor"; sglang: "sha256" | "sha256-bigram" (= Bigram); kvgate: "fast"
	BlockSize int         // tokens per hashed block: SGLang page size; vLLM's hash block size (block_size x decode-context-parallel size; hybrid models: prefix_match_unit or the GCD of group block sizes)
	Seed      string      // the engine's PYTHONHASHSEED value (vLLM only)
	SeedSet   bool        // false: the engine runs with PYTHONHASHSEED unset
	// Bigram (SGLang only): the engine runs EAGLE speculative decoding, whose radix
	// cache keys pages by token bigrams; BlockSize counts bigrams per page.
	Bigram bool
}

// New returns the chain for s, or an error naming what cannot be matched. An empty Algo
// means the engine's default (vLLM: sha256, SGLang: sha256, kvgate: fast).
// SGLang's page hash has no seed and no LoRA key: Seed is ignored for it; a cache salt
// seeds its first page.
func New(s Spec) (Chain, error) {
	switch s.Engine {
	case engine.VLLM, engine.SGLang, Kvgate:
	case "":
		return nil, paramError(ParamEngine, "hashcore: engine not set (want vllm, sglang or kvgate)")
	default:
		return nil, paramError(ParamEngine, "hashcore: unknown engine %q (want vllm, sglang or kvgate)", s.Engine)
	}
	if s.BlockSize < 1 {
		return nil, paramError(ParamBlockSize, "hashcore: block size %d: must be at least 1", s.BlockSize)
	}
	if s.BlockSize > MaxBlockSize {
		return nil, paramError(ParamBlockSize, "hashcore: block size %d: must be at most %d", s.BlockSize, MaxBlockSize)
	}
	if s.Bigram && s.Engine != engine.SGLang {
		return nil, paramError(ParamBigram, "hashcore: %s: bigram page keys are SGLang's (EAGLE); no %s contract hashes bigrams", s.Engine, s.Engine)
	}
	switch s.Engine {
	case engine.VLLM:
		return newVLLM(s)
	case engine.SGLang:
		switch s.Algo {
		case "", "sha256":
		case "sha256-bigram": // the chain's name, so -kv-hash-algo can select it too
			s.Bigram = true
		default:
			return nil, paramError(ParamAlgo, "hashcore: sglang algo %q: SGLang pages use sha256 (sha256-bigram with EAGLE speculative decoding)", s.Algo)
		}
		return &sglangChain{blockSize: s.BlockSize, bigram: s.Bigram}, nil
	default: // "kvgate"
		if s.Algo != "" && s.Algo != "fast" {
			return nil, paramError(ParamAlgo, "hashcore: kvgate algo %q: want fast", s.Algo)
		}
		return NewFast(s.BlockSize), nil
	}
}

func newVLLM(s Spec) (Chain, error) {
	c := &vllmChain{blockSize: s.BlockSize, cbor: newCBORBlockEncoder(s.BlockSize)}
	algo := s.Algo
	if algo == "" {
		algo = "sha256"
	}
	switch algo {
	case "sha256":
		c.pickle = true
	case "sha256_cbor":
	case "xxhash":
		c.pickle, c.xxh = true, true
	case "xxhash_cbor":
		c.xxh = true
	default:
		return nil, paramError(ParamAlgo, "hashcore: unknown vllm algo %q (want sha256, sha256_cbor, xxhash or xxhash_cbor)", s.Algo)
	}
	c.name = "vllm/" + algo
	seed := s.Seed
	if !s.SeedSet {
		if c.xxh {
			return nil, paramError(ParamSeed, "hashcore: vllm %s with PYTHONHASHSEED unset: vLLM derives NONE_HASH from a random per-process seed for xxhash algos, so no parity is possible; start the engine with PYTHONHASHSEED set and pass the same value as the seed", algo)
		}
		seed = DefaultNoneHashSeed
	}
	if err := checkString(ParamSeed, "seed", seed); err != nil {
		return nil, err
	}
	c.root = c.digestOf(c.encodeSeed(nil, seed))
	return c, nil
}

// ValidateExtras reports whether ex can be hashed: strings must be valid UTF-8 (Python
// str) and at most MaxStringLen bytes. AppendKeys returns no keys for extras that fail.
func ValidateExtras(ex *Extras) error {
	if ex == nil {
		return nil
	}
	if err := checkString(ParamLoRAName, "LoRA name", ex.LoRAName); err != nil {
		return err
	}
	return checkString(ParamCacheSalt, "cache salt", ex.CacheSalt)
}

// checkString refuses s, the value of param (what in the message), unless kvgate can
// encode it as CPython does.
func checkString(param, what, s string) error {
	if len(s) > MaxStringLen {
		return paramError(param, "hashcore: %s is %d bytes: at most %d are supported", what, len(s), MaxStringLen)
	}
	if !utf8.ValidString(s) {
		return paramError(param, "hashcore: %s is not valid UTF-8", what)
	}
	return nil
}

// Bytes returns the meaningful bytes of d.
func (d *Digest) Bytes() []byte { return d.B[:d.N] }
