package hashcore

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// sglangExtCase is one tools/gen-sglang-goldens.py vector: SGLang's salted and EAGLE
// bigram page keys, from hashlib reproducing SGLang's functions.
type sglangExtCase struct {
	goldenCase
	Bigram bool `json:"bigram"`
}

func loadSGLangExt(t *testing.T) []sglangExtCase {
	t.Helper()
	var doc struct {
		Cases []sglangExtCase `json:"cases"`
	}
	loadJSONFile(t, "sglang_ext.json", &doc)
	if len(doc.Cases) < 12 {
		t.Fatalf("only %d sglang_ext cases", len(doc.Cases))
	}
	return doc.Cases
}

func checkSGLangExt(t *testing.T) {
	for _, gc := range loadSGLangExt(t) {
		c, err := New(Spec{Engine: "sglang", BlockSize: gc.BlockSize, Bigram: gc.Bigram})
		if err != nil {
			t.Fatal(err)
		}
		keys, last := c.AppendKeys(nil, c.Root(), gc.Tokens, gc.extras(), true)
		name := gc.String() + "/bigram=" + map[bool]string{true: "y", false: "n"}[gc.Bigram]
		if len(keys) != len(gc.Keys) {
			t.Errorf("%s: %d keys, want %d", name, len(keys), len(gc.Keys))
			continue
		}
		for i := range keys {
			if keys[i] != gc.Keys[i] || int64(keys[i]) != gc.EventValues[i] {
				t.Errorf("%s: key %d = %d, want %d (event value %d)", name, i, keys[i], gc.Keys[i], gc.EventValues[i])
				break
			}
		}
		if n := len(gc.Digests); n > 0 && hex.EncodeToString(last.Bytes()) != gc.Digests[n-1] {
			t.Errorf("%s: last digest %x, want %s", name, last.Bytes(), gc.Digests[n-1])
		}
	}
}

func TestSGLangSaltBigramGoldens(t *testing.T) { checkSGLangExt(t) }

func TestSGLangSaltBigramGoldensPortablePath(t *testing.T) {
	withPortablePath(t, func() { checkSGLangExt(t) })
	if haveSHA256Blocks {
		withSHA256Blocks(t, false, func() { checkSGLangExt(t) })
	}
}

// A bigram chain continued block by block, each call given its block's tokens and the
// next one, equals the whole-prompt chain; the salt seeds only the first call.
func TestSGLangBigramChaining(t *testing.T) {
	toks := testTokens(16*8 + 1)
	ex := &Extras{CacheSalt: "tenant"}
	for _, bs := range []int{1, 4, 16} {
		c, err := New(Spec{Engine: "sglang", BlockSize: bs, Bigram: true})
		if err != nil {
			t.Fatal(err)
		}
		if c.Name() != "sglang/sha256-bigram" {
			t.Fatalf("name %q", c.Name())
		}
		whole := Keys(c, nil, toks, ex)
		if len(whole) != (len(toks)-1)/bs {
			t.Fatalf("bs=%d: %d keys", bs, len(whole))
		}
		var got []uint64
		d := c.Root()
		for i := 0; i < len(whole); i++ {
			got, d = c.AppendKeys(got, d, toks[i*bs:(i+1)*bs+1], ex, i == 0)
		}
		for i := range whole {
			if got[i] != whole[i] {
				t.Fatalf("bs=%d: block %d differs when chained one block per call", bs, i)
			}
		}
		plain, _ := New(Spec{Engine: "sglang", BlockSize: bs})
		if Keys(plain, nil, toks, ex)[0] == whole[0] {
			t.Fatalf("bs=%d: bigram key equals the plain key", bs)
		}
	}
	if _, err := New(Spec{Engine: "vllm", BlockSize: 16, Bigram: true}); err == nil {
		t.Fatal("vllm with bigram accepted")
	}
}

func TestSGLangSaltBigramAllocatesNothing(t *testing.T) {
	toks := testTokens(8192)
	for _, bs := range []int{1, 16, 64} {
		for _, bigram := range []bool{false, true} {
			c, err := New(Spec{Engine: "sglang", BlockSize: bs, Bigram: bigram})
			if err != nil {
				t.Fatal(err)
			}
			ex := &Extras{CacheSalt: "tenant-a"}
			dst := make([]uint64, 0, len(toks))
			dst, _ = c.AppendKeys(dst, c.Root(), toks, ex, true)
			if allocs := testing.AllocsPerRun(20, func() {
				dst, _ = c.AppendKeys(dst[:0], c.Root(), toks, ex, true)
			}); allocs != 0 {
				t.Errorf("%s bs=%d salted: %.1f allocs per AppendKeys, want 0", c.Name(), bs, allocs)
			}
		}
	}
}

func loadJSONFile(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "hash", file))
	if err != nil {
		t.Fatalf("golden %s: %v (regenerate with /usr/bin/python3 tools/gen-sglang-goldens.py)", file, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("golden %s: %v", file, err)
	}
}
