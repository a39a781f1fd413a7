package hashcore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"
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
	byAlgo, err := New(Spec{Engine: "sglang", Algo: "sha256-bigram", BlockSize: 4})
	if err != nil || byAlgo.Name() != "sglang/sha256-bigram" || !HashesBigrams(byAlgo) {
		t.Fatalf("algo sha256-bigram: %v %v", byAlgo, err)
	}
	if _, err := New(Spec{Engine: "sglang", Algo: "sha256_cbor", BlockSize: 4}); err == nil {
		t.Fatal("sglang sha256_cbor accepted")
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

// sglangReference is SGLang's page hash written the plain way (crypto/sha256, a fresh
// message per page), for the differential fuzz below.
func sglangReference(bs int, tokens []uint32, salt string, bigram bool) []uint64 {
	var prior []byte
	if salt != "" {
		d := sha256.Sum256([]byte(sglangSaltPrefix + salt))
		prior = d[:]
	}
	var words []uint32
	n := len(tokens) / bs
	if bigram {
		n = 0
		if len(tokens) > 0 {
			n = (len(tokens) - 1) / bs
		}
	}
	var keys []uint64
	for i := 0; i < n; i++ {
		words = words[:0]
		for j := i * bs; j < (i+1)*bs; j++ {
			words = append(words, tokens[j])
			if bigram {
				words = append(words, tokens[j+1])
			}
		}
		msg := append([]byte{}, prior...)
		for _, w := range words {
			msg = binary.LittleEndian.AppendUint32(msg, w)
		}
		d := sha256.Sum256(msg)
		prior = d[:]
		keys = append(keys, binary.BigEndian.Uint64(d[:8]))
	}
	return keys
}

// FuzzSGLangSaltBigram: salted and bigram chains, on every SHA-256 path, equal the plain
// reference for fuzzed tokens, page sizes and salts.
func FuzzSGLangSaltBigram(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, uint8(2), "tenant", true)
	f.Add(make([]byte, 200), uint8(4), "", false)
	f.Add([]byte("salted page keys for sglang with a long enough run of bytes"), uint8(16), "\u00e9", false)
	f.Fuzz(func(t *testing.T, raw []byte, bs8 uint8, salt string, bigram bool) {
		bs := int(bs8%32) + 1
		if !utf8.ValidString(salt) {
			return
		}
		tokens := make([]uint32, len(raw)/2)
		for i := range tokens {
			tokens[i] = uint32(raw[2*i]) | uint32(raw[2*i+1])<<8 | uint32(raw[2*i])<<24
		}
		c, err := New(Spec{Engine: "sglang", BlockSize: bs, Bigram: bigram})
		if err != nil {
			t.Fatal(err)
		}
		want := sglangReference(bs, tokens, salt, bigram)
		check := func(path string) {
			got := Keys(c, nil, tokens, &Extras{CacheSalt: salt})
			if len(got) != len(want) {
				t.Fatalf("%s: %d keys, want %d", path, len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%s: key %d differs", path, i)
				}
			}
		}
		check("default")
		for _, path := range sha256ChainPaths() {
			withChainPath(path, func() { check(path.name) })
		}
		withPortablePath(t, func() { check("portable") })
	})
}

// BenchmarkSGLangSaltBigram: an 8,192-token prompt in 16-token pages, salted, with plain
// and EAGLE bigram pages (a bigram page hashes twice the bytes, on the portable loop).
func BenchmarkSGLangSaltBigram(b *testing.B) {
	toks := benchPrompt()
	for _, bigram := range []bool{false, true} {
		c, err := New(Spec{Engine: "sglang", BlockSize: benchBlock, Bigram: bigram})
		if err != nil {
			b.Fatal(err)
		}
		ex := &Extras{CacheSalt: "tenant-a"}
		b.Run(c.Name()+"/salted", func(b *testing.B) {
			dst := make([]uint64, 0, len(toks))
			b.SetBytes(int64(4 * len(toks)))
			b.ReportAllocs()
			for b.Loop() {
				dst, _ = c.AppendKeys(dst[:0], c.Root(), toks, ex, true)
			}
		})
	}
}
