package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/hashcore"
)

func init() {
	register("hash", "print the block keys an engine computes for token IDs on stdin", runHash)
}

// hashDefaultBlockSize is each engine's default block size (SGLang: --page-size 1).
var hashDefaultBlockSize = map[engine.Kind]int{engine.VLLM: 16, engine.SGLang: 1, hashcore.Kvgate: 16}

// hashParamFlags is the flag of each contract parameter hashcore can refuse (bigram page
// keys are asked for through -algo sha256-bigram).
var hashParamFlags = map[string]string{
	hashcore.ParamEngine: "-engine", hashcore.ParamAlgo: "-algo", hashcore.ParamBigram: "-algo",
	hashcore.ParamBlockSize: "-block-size", hashcore.ParamSeed: "-seed",
	hashcore.ParamLoRAName: "-lora-name", hashcore.ParamCacheSalt: "-cache-salt",
}

// hashRefused prints a refusal by hashcore.New or ValidateExtras naming the flag to fix.
func hashRefused(stderr io.Writer, err error) {
	var pe *hashcore.ParamError
	if errors.As(err, &pe) && hashParamFlags[pe.Param] != "" {
		fmt.Fprintf(stderr, "kvgate hash: %s: %v\n", hashParamFlags[pe.Param], err)
		return
	}
	fmt.Fprintf(stderr, "kvgate hash: %v\n", err)
}

// runHash prints the keys of every full block of a JSON array of token IDs read from
// stdin, as one JSON object, so operators can check parity against an engine's events.
func runHash(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hash", flag.ContinueOnError)
	fs.SetOutput(stderr)
	engineFlag := fs.String("engine", "vllm", "engine contract: vllm, sglang or kvgate (kvgate's own fast key)")
	algo := fs.String("algo", "", "vllm --prefix-caching-hash-algo: sha256 (default), sha256_cbor, xxhash, xxhash_cbor; sglang: sha256; kvgate: fast")
	blockSize := fs.Int("block-size", 0, "tokens per block (SGLang page size); default: the engine's (vllm 16, sglang 1)")
	seed := fs.String("seed", "", "the engine's PYTHONHASHSEED value; omit when the engine runs without it")
	lora := fs.String("lora-name", "", "LoRA adapter name (enters every block's extra keys)")
	salt := fs.String("cache-salt", "", "cache_salt of the request (enters block 0's extra keys)")
	digests := fs.Bool("digests", false, "also print none_hash and every block's full digest (hex)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvgate hash -engine vllm|sglang -algo ALGO -block-size N [-seed S] [-lora-name NAME] [-cache-salt S] [-digests] < tokens.json")
		fmt.Fprintln(stderr, "Reads a JSON array of token IDs; prints {\"keys\":[...]} with each key as an unsigned 64-bit decimal.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvgate hash: unexpected argument %q (token IDs are read from stdin)\n", fs.Arg(0))
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	eng := engine.Kind(*engineFlag)
	spec := hashcore.Spec{Engine: eng, Algo: *algo, BlockSize: *blockSize, Seed: *seed, SeedSet: set["seed"]}
	if !set["block-size"] {
		if bs, ok := hashDefaultBlockSize[eng]; ok {
			spec.BlockSize = bs
		}
	}
	if eng == engine.SGLang && (*lora != "" || *salt != "") {
		fmt.Fprintln(stderr, "kvgate hash: sglang page hashes carry no extra keys: -lora-name and -cache-salt do not apply")
		return 2
	}
	if eng != engine.VLLM && set["seed"] {
		fmt.Fprintf(stderr, "kvgate hash: -seed applies to vllm only: %s block keys have no seed\n", eng)
		return 2
	}
	chain, err := hashcore.New(spec)
	if err != nil {
		hashRefused(stderr, err)
		return 2
	}
	var ex *hashcore.Extras
	if *lora != "" || *salt != "" {
		ex = &hashcore.Extras{LoRAName: *lora, CacheSalt: *salt}
		if err := hashcore.ValidateExtras(ex); err != nil {
			hashRefused(stderr, err)
			return 2
		}
	}
	tokens, err := readTokenIDs(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "kvgate hash: stdin: %v\n", err)
		return 2
	}

	var out bytes.Buffer
	out.WriteString(`{"keys":[`)
	if !*digests {
		keys := hashcore.Keys(chain, nil, tokens, ex)
		for i, k := range keys {
			if i > 0 {
				out.WriteByte(',')
			}
			out.WriteString(strconv.FormatUint(k, 10))
		}
		out.WriteString("]}\n")
	} else {
		// Block by block, to print every full digest.
		bs := chain.BlockSize()
		d := chain.Root()
		var keys []uint64
		var hexes []string
		for i := 0; i+bs <= len(tokens); i += bs {
			keys, d = chain.AppendKeys(keys, d, tokens[i:i+bs], ex, i == 0)
			hexes = append(hexes, hex.EncodeToString(d.Bytes()))
		}
		for i, k := range keys {
			if i > 0 {
				out.WriteByte(',')
			}
			out.WriteString(strconv.FormatUint(k, 10))
		}
		out.WriteString(`],"none_hash":`)
		if root := chain.Root(); root.N == 0 {
			out.WriteString("null") // SGLang and kvgate chains have no root digest
		} else {
			out.WriteString(`"` + hex.EncodeToString(root.Bytes()) + `"`)
		}
		out.WriteString(`,"digests":[`)
		for i, h := range hexes {
			if i > 0 {
				out.WriteByte(',')
			}
			out.WriteString(`"` + h + `"`)
		}
		out.WriteString("]}\n")
	}
	if _, err := stdout.Write(out.Bytes()); err != nil {
		fmt.Fprintf(stderr, "kvgate hash: %v\n", err)
		return 1
	}
	return 0
}

// readTokenIDs parses one JSON array of integers in [0, 2^32-1] and nothing else.
func readTokenIDs(r io.Reader) ([]uint32, error) {
	dec := json.NewDecoder(bufio.NewReader(r))
	dec.UseNumber()
	var raw []any
	if err := dec.Decode(&raw); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty input: want a JSON array of token IDs")
		}
		return nil, fmt.Errorf("not a JSON array of token IDs: %v", err)
	}
	if raw == nil {
		return nil, errors.New("null: want a JSON array of token IDs")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON array")
	}
	tokens := make([]uint32, len(raw))
	for i, v := range raw {
		n, ok := v.(json.Number)
		if !ok {
			return nil, fmt.Errorf("token %d is %s, not an integer", i, jsonKind(v))
		}
		s := n.String()
		if len(s) > 0 && s[0] == '-' {
			return nil, fmt.Errorf("token %d (%s) is negative", i, s)
		}
		u, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("token %d (%s) is not an integer token ID", i, s)
		}
		if u > 1<<32-1 {
			return nil, fmt.Errorf("token %d (%s) exceeds 2^32-1", i, s)
		}
		tokens[i] = uint32(u)
	}
	return tokens, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "not a number"
}
