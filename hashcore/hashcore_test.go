package hashcore

import (
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
)

// The published vectors of CONTRACTS.md §1.1 and §2, copied from that document.
func TestPublishedVectors(t *testing.T) {
	c, err := New(Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	root := c.Root()
	if got := hex.EncodeToString(root.Bytes()); got != "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0" {
		t.Errorf("NONE_HASH = %s", got)
	}
	keys, d := c.AppendKeys(nil, Digest{}, []uint32{1, 2, 3, 4}, nil, true)
	if got := hex.EncodeToString(d.Bytes()); got != "58d0879dff3800f65f8c5fd449d73048c0f7699dd238a03b84b146b151d55111" {
		t.Errorf("digest = %s", got)
	}
	if len(keys) != 1 || keys[0] != 9561501211280363793 {
		t.Errorf("keys = %v, want [9561501211280363793]", keys)
	}

	sg, err := New(Spec{Engine: "sglang", Algo: "sha256", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	keys = Keys(sg, nil, []uint32{1, 2, 3, 4}, nil)
	if want := int64(-3488128144981237669); len(keys) != 1 || int64(keys[0]) != want {
		t.Errorf("sglang keys = %v, want the bits of %d", keys, want)
	}
}

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Engine: "tgi", BlockSize: 16}, `unknown engine "tgi"`},
		{Spec{BlockSize: 16}, "engine not set"},
		{Spec{Engine: "vllm", Algo: "md5", BlockSize: 16}, `unknown vllm algo "md5"`},
		{Spec{Engine: "vllm", Algo: "sha256_cbor_64bit", BlockSize: 16}, "unknown vllm algo"},
		{Spec{Engine: "vllm", Algo: "sha256", BlockSize: 0}, "block size 0"},
		{Spec{Engine: "sglang", BlockSize: -3}, "block size -3"},
		{Spec{Engine: "vllm", BlockSize: MaxBlockSize + 1}, "at most"},
		{Spec{Engine: "vllm", Algo: "xxhash", BlockSize: 16}, "random"},
		{Spec{Engine: "vllm", Algo: "xxhash_cbor", BlockSize: 16}, "no parity"},
		{Spec{Engine: "sglang", Algo: "sha256_cbor", BlockSize: 16}, "SGLang pages use sha256 (sha256-bigram"},
		{Spec{Engine: "kvgate", Algo: "sha256", BlockSize: 16}, "want fast"},
		{Spec{Engine: "vllm", BlockSize: 16, Seed: "\xff", SeedSet: true}, "UTF-8"},
		{Spec{Engine: "vllm", BlockSize: 16, Seed: strings.Repeat("x", MaxStringLen+1), SeedSet: true}, "at most"},
	} {
		c, err := New(tc.spec)
		if err == nil || c != nil {
			t.Errorf("New(%+v) = %v, %v; want error", tc.spec, c, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) error %q does not say %q", tc.spec, err, tc.want)
		}
	}
}

// TestErrorsNameTheParam: every refusal of New and ValidateExtras is a *ParamError
// blaming the parameter to fix, so callers name their flag without reading the text.
func TestErrorsNameTheParam(t *testing.T) {
	long := strings.Repeat("x", MaxStringLen+1)
	for _, tc := range []struct {
		spec  Spec
		param string
	}{
		{Spec{Engine: "tgi", BlockSize: 16}, ParamEngine},
		{Spec{BlockSize: 16}, ParamEngine},
		{Spec{Engine: "vllm", Algo: "md5", BlockSize: 16}, ParamAlgo},
		{Spec{Engine: "sglang", Algo: "sha256_cbor", BlockSize: 16}, ParamAlgo},
		{Spec{Engine: "kvgate", Algo: "sha256", BlockSize: 16}, ParamAlgo},
		{Spec{Engine: "vllm", Algo: "sha256", BlockSize: 0}, ParamBlockSize},
		{Spec{Engine: "sglang", BlockSize: MaxBlockSize + 1}, ParamBlockSize},
		{Spec{Engine: "vllm", Algo: "xxhash", BlockSize: 16}, ParamSeed},
		{Spec{Engine: "vllm", Algo: "xxhash_cbor", BlockSize: 16}, ParamSeed},
		{Spec{Engine: "vllm", BlockSize: 16, Seed: "\xff", SeedSet: true}, ParamSeed},
		{Spec{Engine: "vllm", BlockSize: 16, Seed: long, SeedSet: true}, ParamSeed},
		{Spec{Engine: "vllm", BlockSize: 16, Bigram: true}, ParamBigram},
	} {
		_, err := New(tc.spec)
		var pe *ParamError
		if !errors.As(err, &pe) || pe.Param != tc.param || pe.Error() != err.Error() {
			t.Errorf("New(%+v) = %v (%T); want a *ParamError blaming %s", tc.spec, err, err, tc.param)
		}
	}
	for ex, param := range map[Extras]string{
		{LoRAName: "\xff"}: ParamLoRAName, {LoRAName: long}: ParamLoRAName,
		{CacheSalt: "\xfe"}: ParamCacheSalt, {CacheSalt: long}: ParamCacheSalt,
	} {
		err := ValidateExtras(&ex)
		var pe *ParamError
		if !errors.As(err, &pe) || pe.Param != param {
			t.Errorf("ValidateExtras(%.20q) = %v; want a *ParamError blaming %s", ex.LoRAName+ex.CacheSalt, err, param)
		}
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		name string
	}{
		{Spec{Engine: "vllm", BlockSize: 16}, "vllm/sha256"},
		{Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 16}, "vllm/sha256_cbor"},
		{Spec{Engine: "vllm", Algo: "xxhash", BlockSize: 16, SeedSet: true}, "vllm/xxhash"},
		{Spec{Engine: "vllm", Algo: "xxhash_cbor", BlockSize: 16, Seed: "1", SeedSet: true}, "vllm/xxhash_cbor"},
		{Spec{Engine: "sglang", BlockSize: 1}, "sglang/sha256"},
		{Spec{Engine: "kvgate", BlockSize: 16}, "kvgate/fast"},
	} {
		c, err := New(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		if c.Name() != tc.name || c.BlockSize() != tc.spec.BlockSize {
			t.Errorf("New(%+v): %s bs=%d, want %s", tc.spec, c.Name(), c.BlockSize(), tc.name)
		}
	}
	if NewFast(0).BlockSize() != 1 {
		t.Error("NewFast(0) should clamp to block size 1")
	}
}

// allChains returns one chain per contract, block size bs.
func allChains(t testing.TB, bs int) []Chain {
	t.Helper()
	var out []Chain
	for _, s := range []Spec{
		{Engine: "vllm", Algo: "sha256", BlockSize: bs},
		{Engine: "vllm", Algo: "sha256_cbor", BlockSize: bs},
		{Engine: "vllm", Algo: "xxhash", BlockSize: bs, Seed: "0", SeedSet: true},
		{Engine: "vllm", Algo: "xxhash_cbor", BlockSize: bs, Seed: "0", SeedSet: true},
		{Engine: "sglang", BlockSize: bs},
		{Engine: "kvgate", Algo: "fast", BlockSize: bs},
	} {
		c, err := New(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func testTokens(n int) []uint32 {
	t := make([]uint32, n)
	x := uint32(2463534242)
	for i := range t {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		t[i] = x >> (i % 24) // every integer width
	}
	return t
}

// The salt enters block 0 only: hashing from block 1 with first=false, chained on block
// 0's digest, must equal the tail of a whole-prompt hash; and a salt passed with
// first=false must change nothing.
func TestChainingAndSalt(t *testing.T) {
	toks := testTokens(64)
	ex := &Extras{LoRAName: "ad", CacheSalt: "tenant"}
	for _, c := range allChains(t, 16) {
		whole := Keys(c, nil, toks, ex)
		head, d := c.AppendKeys(nil, c.Root(), toks[:16], ex, true)
		tail, _ := c.AppendKeys(head, d, toks[16:], ex, false)
		if len(whole) != 4 || len(tail) != 4 {
			t.Fatalf("%s: %d/%d keys, want 4", c.Name(), len(whole), len(tail))
		}
		for i := range whole {
			if whole[i] != tail[i] {
				t.Errorf("%s: key %d differs when chained in two calls", c.Name(), i)
			}
		}
		noSaltFirst := Keys(c, nil, toks, &Extras{LoRAName: "ad"})
		saltNotFirst, _ := c.AppendKeys(nil, c.Root(), toks, ex, false)
		for i := range noSaltFirst {
			if noSaltFirst[i] != saltNotFirst[i] {
				t.Errorf("%s: salt with first=false changed key %d", c.Name(), i)
			}
		}
		if whole[0] == noSaltFirst[0] {
			t.Errorf("%s: cache salt did not change block 0", c.Name())
		}
	}
}

func TestInvalidExtrasYieldNoKeys(t *testing.T) {
	toks := testTokens(32)
	for _, ex := range []*Extras{{LoRAName: "\xc3\x28"}, {CacheSalt: strings.Repeat("s", MaxStringLen+1)}} {
		if ValidateExtras(ex) == nil {
			t.Errorf("ValidateExtras(%.10q) = nil", ex.LoRAName)
		}
		for _, c := range allChains(t, 16)[:4] {
			keys, d := c.AppendKeys([]uint64{7}, c.Root(), toks, ex, true)
			if len(keys) != 1 || d != c.Root() {
				t.Errorf("%s: invalid extras produced keys %v", c.Name(), keys)
			}
		}
	}
	if err := ValidateExtras(&Extras{LoRAName: "ok", CacheSalt: "中文"}); err != nil {
		t.Error(err)
	}
}

func TestConcurrentUse(t *testing.T) {
	toks := testTokens(1024)
	for _, c := range allChains(t, 16) {
		want := Keys(c, nil, toks, &Extras{LoRAName: "l"})
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var dst []uint64
				for i := 0; i < 20; i++ {
					dst = Keys(c, dst[:0], toks, &Extras{LoRAName: "l"})
					for j := range want {
						if dst[j] != want[j] {
							t.Errorf("%s: concurrent key %d differs", c.Name(), j)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
	}
}

func TestAppendKeysAllocatesNothing(t *testing.T) {
	for _, bs := range []int{1, 16, 128} {
		toks := testTokens(8192)
		ex := &Extras{LoRAName: "lora", CacheSalt: "salt"}
		for _, c := range allChains(t, bs) {
			dst := make([]uint64, 0, len(toks))
			dst, _ = c.AppendKeys(dst, c.Root(), toks, ex, true) // warm the scratch list
			allocs := testing.AllocsPerRun(20, func() {
				dst, _ = c.AppendKeys(dst[:0], c.Root(), toks, ex, true)
			})
			if allocs != 0 {
				t.Errorf("%s bs=%d: %.1f allocs per AppendKeys, want 0", c.Name(), bs, allocs)
			}
		}
	}
}

func TestCPUReport(t *testing.T) {
	f := CPUFeatures()
	if f == "" {
		t.Fatal("CPUFeatures is empty")
	}
	for _, p := range []string{SHA256Path(), XXH3Path()} {
		if p == "" {
			t.Fatal("empty path name")
		}
	}
	// The report must agree with itself: SHA-NI is only picked when the CPU has it.
	if strings.HasPrefix(SHA256Path(), "sha-ni") && !strings.Contains(f, "sha-ni") {
		t.Errorf("SHA256Path sha-ni but CPUFeatures %q", f)
	}
}
