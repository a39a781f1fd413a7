package hashcore

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Goldens come from tools/gen-hash-goldens.py (Python pickle/hashlib, cbor2, xxhash).

type tokenRepeat struct {
	Value uint32 `json:"value"`
	Count int    `json:"count"`
}

type goldenCase struct {
	Name         string       `json:"name"`
	Algo         string       `json:"algo"`
	BlockSize    int          `json:"block_size"`
	SeedSet      bool         `json:"seed_set"`
	Seed         string       `json:"seed"`
	LoRAName     string       `json:"lora_name"`
	CacheSalt    string       `json:"cache_salt"`
	Tokens       []uint32     `json:"tokens"`
	TokensRepeat *tokenRepeat `json:"tokens_repeat"`
	NoneHash     string       `json:"none_hash"`
	Keys         []uint64     `json:"keys"`
	Digests      []string     `json:"digests"`
	Encodings    []string     `json:"encodings"`
	EventValues  []int64      `json:"event_values"`
}

func (c *goldenCase) tokens() []uint32 {
	if c.TokensRepeat == nil {
		return c.Tokens
	}
	t := make([]uint32, c.TokensRepeat.Count)
	for i := range t {
		t[i] = c.TokensRepeat.Value
	}
	return t
}

func (c *goldenCase) extras() *Extras {
	if c.LoRAName == "" && c.CacheSalt == "" {
		return nil
	}
	return &Extras{LoRAName: c.LoRAName, CacheSalt: c.CacheSalt}
}

func (c *goldenCase) String() string {
	return fmt.Sprintf("%s/%s/bs=%d/seed_set=%v seed=%.20q lora=%.20q salt=%.20q", c.Name, c.Algo, c.BlockSize, c.SeedSet, c.Seed, c.LoRAName, c.CacheSalt)
}

func loadGolden(t testing.TB, file string) []goldenCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "hash", file))
	if err != nil {
		t.Fatalf("golden %s: %v (regenerate with `make goldens`)", file, err)
	}
	var doc struct {
		Cases []goldenCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("golden %s: %v", file, err)
	}
	if len(doc.Cases) == 0 {
		t.Fatalf("golden %s has no cases", file)
	}
	return doc.Cases
}

func TestVLLMGoldens(t *testing.T) {
	cases := loadGolden(t, "vllm.json")
	algos := map[string]int{}
	for i := range cases {
		gc := &cases[i]
		algos[gc.Algo]++
		c, err := New(Spec{Engine: "vllm", Algo: gc.Algo, BlockSize: gc.BlockSize, Seed: gc.Seed, SeedSet: gc.SeedSet})
		if err != nil {
			t.Fatalf("%v: New: %v", gc, err)
		}
		root := c.Root()
		if got := hex.EncodeToString(root.Bytes()); got != gc.NoneHash {
			t.Errorf("%v: NONE_HASH %s, want %s", gc, got, gc.NoneHash)
			continue
		}
		toks := gc.tokens()
		ex := gc.extras()
		keys, last := c.AppendKeys(nil, c.Root(), toks, ex, true)
		checkKeys(t, gc, keys, gc.Keys)
		if len(gc.Digests) > 0 {
			if got, want := hex.EncodeToString(last.Bytes()), gc.Digests[len(gc.Digests)-1]; got != want {
				t.Errorf("%v: last digest %s, want %s", gc, got, want)
			}
		} else if last != c.Root() {
			t.Errorf("%v: no full block, but last digest %x is not the root", gc, last.Bytes())
		}
		// The encoder alone, block by block, must produce the oracle's bytes.
		vc := c.(*vllmChain)
		parent := c.Root()
		for bi, want := range gc.Encodings {
			var p pickler
			lora, salt := "", ""
			if ex != nil {
				lora = ex.LoRAName
				if bi == 0 {
					salt = ex.CacheSalt
				}
			}
			blk := toks[bi*gc.BlockSize : (bi+1)*gc.BlockSize]
			var msg []byte
			if vc.pickle {
				msg = appendBlockPickle(&p, nil, parent.Bytes(), blk, lora, salt)
			} else {
				msg = appendBlockCBOR(nil, parent.Bytes(), blk, lora, salt)
			}
			if got := hex.EncodeToString(msg); got != want {
				t.Errorf("%v: block %d encoding\n got %s\nwant %s", gc, bi, got, want)
				break
			}
			parent = vc.digestOf(msg)
		}
		// Chaining block by block from the returned digests gives the same keys.
		if len(gc.Keys) > 1 && len(toks) < 5000 {
			var step []uint64
			d := c.Root()
			for bi := 0; bi < len(gc.Keys); bi++ {
				step, d = c.AppendKeys(step, d, toks[bi*gc.BlockSize:(bi+1)*gc.BlockSize], ex, bi == 0)
			}
			checkKeys(t, gc, step, gc.Keys)
		}
	}
	for _, a := range []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"} {
		if algos[a] == 0 {
			t.Errorf("goldens hold no %s case", a)
		}
	}
}

func checkKeys(t *testing.T, gc fmt.Stringer, got, want []uint64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%v: %d keys, want %d", gc, len(got), len(want))
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%v: key %d = %d, want %d", gc, i, got[i], want[i])
			return
		}
	}
}

func TestSGLangGoldens(t *testing.T) {
	for _, gc := range loadGolden(t, "sglang.json") {
		c, err := New(Spec{Engine: "sglang", BlockSize: gc.BlockSize})
		if err != nil {
			t.Fatal(err)
		}
		keys, last := c.AppendKeys(nil, c.Root(), gc.Tokens, nil, true)
		checkKeys(t, &gc, keys, gc.Keys)
		for i, v := range gc.EventValues {
			if i < len(keys) && keys[i] != uint64(v) {
				t.Errorf("%v: key %d = %d is not the bits of event value %d", &gc, i, keys[i], v)
			}
		}
		if n := len(gc.Digests); n > 0 {
			if got := hex.EncodeToString(last.Bytes()); got != gc.Digests[n-1] {
				t.Errorf("%v: last digest %s, want %s", &gc, got, gc.Digests[n-1])
			}
		}
	}
}

func TestFastGoldens(t *testing.T) {
	for _, gc := range loadGolden(t, "fast.json") {
		c := NewFast(gc.BlockSize)
		keys, _ := c.AppendKeys(nil, c.Root(), gc.Tokens, gc.extras(), true)
		checkKeys(t, &gc, keys, gc.Keys)
	}
}
