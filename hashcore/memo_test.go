package hashcore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvgate/kvgate/internal/testfix"
)

// memoSpecs is every contract, at the block sizes that take each of its code paths (the
// AVX-512 fused loops need a multiple of 4, 1 and 5 are not; 300 tokens overflow one pickle frame).
func memoSpecs() []Spec {
	var out []Spec
	for _, bs := range []int{16, 5, 1, 300} {
		out = append(out,
			Spec{Engine: "vllm", Algo: "sha256", BlockSize: bs},
			Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: bs},
			Spec{Engine: "vllm", Algo: "xxhash", BlockSize: bs, Seed: "0", SeedSet: true},
			Spec{Engine: "vllm", Algo: "xxhash_cbor", BlockSize: bs, Seed: "42", SeedSet: true},
			Spec{Engine: "sglang", BlockSize: bs},
			Spec{Engine: "kvgate", BlockSize: bs})
	}
	return out
}

func newTestChainMemo(t testing.TB, c Chain, maxBytes int64) *ChainMemo {
	t.Helper()
	m, err := NewChainMemo(c, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var memoExtras = []*Extras{nil, {LoRAName: "adapter-a"}, {CacheSalt: "salt-1"},
	{LoRAName: "adapter-a", CacheSalt: "salt-1"}, {LoRAName: "adapter-b", CacheSalt: "salt-1"}, {CacheSalt: "salt-2"}}

// TestChainMemoGoldens: the oracle goldens (Python pickle/hashlib, cbor2, xxhash) through a
// memo: cold, warm, and after a shorter prefix of the same tokens was memoized.
func TestChainMemoGoldens(t *testing.T) {
	for _, file := range []string{"vllm.json", "sglang.json", "fast.json"} {
		for _, gc := range loadGolden(t, file) {
			var spec Spec
			switch file {
			case "vllm.json":
				spec = Spec{Engine: "vllm", Algo: gc.Algo, BlockSize: gc.BlockSize, Seed: gc.Seed, SeedSet: gc.SeedSet}
			case "sglang.json":
				spec = Spec{Engine: "sglang", BlockSize: gc.BlockSize}
			default:
				spec = Spec{Engine: "kvgate", BlockSize: gc.BlockSize}
			}
			c, err := New(spec)
			if err != nil {
				t.Fatal(err)
			}
			toks, ex := gc.tokens(), gc.extras()
			if file == "sglang.json" {
				ex = nil
			}
			m := newTestChainMemo(t, c, MinChainMemoBytes)
			half := (len(toks) / gc.BlockSize / 2) * gc.BlockSize
			if half > 0 {
				checkKeys(t, &gc, m.AppendKeys(nil, toks[:half+gc.BlockSize/2], ex), gc.Keys[:half/gc.BlockSize])
			}
			for pass := 0; pass < 2; pass++ {
				checkKeys(t, &gc, m.AppendKeys(nil, toks, ex), gc.Keys)
			}
		}
	}
}

// TestChainMemoDifferential grows random conversations block-unaligned turn by turn, with
// edits and regenerated turns, through one memo per contract shared by all extras, and
// compares every prompt's keys with Keys (no memo).
func TestChainMemoDifferential(t *testing.T) {
	for _, spec := range memoSpecs() {
		t.Run(fmt.Sprintf("%s-%s-%d", spec.Engine, spec.Algo, spec.BlockSize), func(t *testing.T) {
			c, err := New(spec)
			if err != nil {
				t.Fatal(err)
			}
			m := newTestChainMemo(t, c, DefaultChainMemoBytes) // no set fills: a repeat must hit
			rng := rand.New(rand.NewPCG(uint64(spec.BlockSize), uint64(len(spec.Algo))))
			maxTokens := 2500
			switch spec.BlockSize {
			case 1:
				maxTokens = 600
			case 300:
				maxTokens = 8000
			}
			var got, want []uint64
			for conv := 0; conv < 16; conv++ {
				ex := memoExtras[conv%len(memoExtras)]
				var toks []uint32
				if conv%4 != 3 { // the same opening under other extras must not share keys
					toks = append(toks, testTokens(200)...)
				}
				for len(toks) < maxTokens {
					for k := rng.IntN(300); k >= 0; k-- {
						toks = append(toks, rng.Uint32N(152000))
					}
					prompt := toks
					switch rng.IntN(6) {
					case 0: // an edit inside the history: a branch that shares a shorter prefix
						prompt = slices.Clone(toks)
						prompt[rng.IntN(len(prompt))] ^= 1
					case 1: // a retry of an earlier turn
						prompt = toks[:rng.IntN(len(toks)+1)]
					}
					got = m.AppendKeys(got[:0], prompt, ex)
					want = Keys(c, want[:0], prompt, ex)
					if !slices.Equal(got, want) {
						t.Fatalf("conv %d, %d tokens, extras %+v: memo keys differ", conv, len(prompt), ex)
					}
					// Sent again, every full stretch is served from the memo.
					hits := m.Stats().Hits
					if got = m.AppendKeys(got[:0], prompt, ex); !slices.Equal(got, want) {
						t.Fatalf("conv %d, %d tokens, extras %+v: memo keys differ when repeated", conv, len(prompt), ex)
					}
					if n := m.Stats().Hits - hits; n != uint64(len(want)/memoStretch*memoStretch) {
						t.Fatalf("conv %d, %d tokens: a repeat hit %d of %d blocks", conv, len(prompt), n, len(want))
					}
				}
			}
			st := m.Stats()
			if st.Hits == 0 || st.Misses == 0 {
				t.Errorf("memo not exercised: %+v", st)
			}
		})
	}
}

// TestChainMemoIdentity: a stretch's identity depends on every token before its end and on
// the extras (the LoRA name on every stretch, the cache salt through stretch 0), and on
// nothing after it.
func TestChainMemoIdentity(t *testing.T) {
	c, _ := New(Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 4})
	m := newTestChainMemo(t, c, MinChainMemoBytes)
	st := memoStretch * 4
	toks := testTokens(3 * st)
	ids := func(toks []uint32, ex *Extras) []memoID {
		var mix, salt uint64
		if ex != nil && ex.LoRAName != "" {
			mix = xxh3.HashStringSeed(ex.LoRAName, memoLoRADomain)
		}
		if ex != nil && ex.CacheSalt != "" {
			salt = xxh3.HashStringSeed(ex.CacheSalt, memoSaltDomain)
		}
		out := []memoID{}
		id := memoID{hi: memoRootHi}
		for s := 0; s < 3; s++ {
			id = m.nextID(id, toks[s*st:(s+1)*st], mix, salt, s == 0, nil)
			out = append(out, id)
		}
		return out
	}
	base := ids(toks, nil)
	seen := map[memoID]string{}
	for _, ex := range memoExtras {
		for s, id := range ids(toks, ex) {
			name := fmt.Sprintf("extras %+v stretch %d", ex, s)
			if prev, dup := seen[id]; dup {
				t.Errorf("%s has the identity of %s", name, prev)
			}
			seen[id] = name
		}
	}
	for _, pos := range []int{0, st - 1, st, 2*st + 3} {
		edited := slices.Clone(toks)
		edited[pos]++
		got := ids(edited, nil)
		for s := range got {
			changed := got[s] != base[s]
			if want := pos < (s+1)*st; changed != want {
				t.Errorf("token %d edited: stretch %d identity changed=%v, want %v", pos, s, changed, want)
			}
		}
	}
	// The high word alone differs when the low words collide: forge a collision of the
	// previous low word and check the identities still differ.
	a := m.nextID(memoID{hi: 1, lo: 7}, toks[:st], 0, 0, false, nil)
	b := m.nextID(memoID{hi: 2, lo: 7}, toks[:st], 0, 0, false, nil)
	if a == b || a.lo != b.lo {
		t.Errorf("identities after prefixes differing only in the high word: %v %v", a, b)
	}
}

// TestChainMemoKeyIsExact: every prefix forced into one set, so entries collide and evict
// all along: keys stay exact; an entry with the right low word and another high word is
// not served.
// lookupOne is one lookup as a walk makes it: the set's tags, then its slots.
func lookupOne(m *ChainMemo, id memoID, d *Digest) ([]uint64, bool) {
	t := m.setTags(id)
	tags := [chainMemoWays]uint64{t[0].Load(), t[1].Load(), t[2].Load(), t[3].Load()}
	return m.lookup(nil, id, &tags, d)
}

func TestChainMemoKeyIsExact(t *testing.T) {
	c, _ := New(Spec{Engine: "vllm", Algo: "sha256", BlockSize: 4})
	m := newTestChainMemo(t, c, MinChainMemoBytes)
	m.sets = 1
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	d := Digest{N: 32}
	d.B[31] = 9
	m.store(memoID{hi: 8, lo: 7}, keys, &d)
	var got Digest
	if _, ok := lookupOne(m, memoID{hi: 9, lo: 7}, &got); ok {
		t.Fatal("served an entry whose high word differs")
	}
	if k, ok := lookupOne(m, memoID{hi: 8, lo: 7}, &got); !ok || !slices.Equal(k, keys) || got != d {
		t.Fatalf("exact entry: %v %v %v", k, ok, got)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	base := testTokens(400)
	for i := 0; i < 200; i++ {
		toks := append(slices.Clone(base[:rng.IntN(len(base))]), testTokens(rng.IntN(40))...)
		ex := memoExtras[i%len(memoExtras)]
		if got, want := m.AppendKeys(nil, toks, ex), Keys(c, nil, toks, ex); !slices.Equal(got, want) {
			t.Fatalf("prompt %d: one-set memo keys differ", i)
		}
	}
	if st := m.Stats(); st.Evictions == 0 || st.Entries > chainMemoWays {
		t.Errorf("one set of %d ways: %+v", chainMemoWays, st)
	}
}

// TestChainMemoBoundUnderChurn: unique prompts stream through a small memo: the table stays
// within the bound, the entry count equals the filled slots, and entries get evicted.
func TestChainMemoBoundUnderChurn(t *testing.T) {
	c, _ := New(Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 16})
	const bound = 128 << 10
	m := newTestChainMemo(t, c, bound)
	var keys []uint64
	for i := 0; i < 400; i++ {
		toks := testTokens(1024)
		toks[0] = uint32(i) // a unique prompt: no shared blocks
		keys = m.AppendKeys(keys[:0], toks, nil)
		st := m.Stats()
		if st.TableBytes > bound || st.Bytes > st.TableBytes {
			t.Fatalf("prompt %d: %+v", i, st)
		}
	}
	filled := 0
	for i := range m.slots {
		if m.slots[i].seq.Load() != 0 {
			filled++
		}
	}
	st := m.Stats()
	if int64(filled) != st.Entries || st.Evictions == 0 || st.Entries < int64(len(m.slots))/2 {
		t.Errorf("filled %d of %d slots: %+v", filled, len(m.slots), st)
	}
}

// TestChainMemoZeroAlloc: a memoized prompt and a follow-up that adds new blocks allocate
// nothing, for every contract.
func TestChainMemoZeroAlloc(t *testing.T) {
	for _, spec := range memoSpecs()[:6] {
		c, _ := New(spec)
		m := newTestChainMemo(t, c, DefaultChainMemoBytes)
		toks := testTokens(4700)
		ex := &Extras{LoRAName: "a", CacheSalt: "s"}
		keys := m.AppendKeys(nil, toks, ex)
		if n := testing.AllocsPerRun(50, func() { keys = m.AppendKeys(keys[:0], toks, ex) }); n != 0 {
			t.Errorf("%s: a memoized prompt allocates %.1f times", c.Name(), n)
		}
		turn := uint32(0)
		if n := testing.AllocsPerRun(50, func() {
			turn++
			toks[4400] = turn // the follow-up's new blocks differ every run
			keys = m.AppendKeys(keys[:0], toks, ex)
		}); n != 0 {
			t.Errorf("%s: a follow-up allocates %.1f times", c.Name(), n)
		}
	}
}

// TestChainMemoConcurrent: goroutines share one small memo over overlapping prompts; every
// result equals Keys.
func TestChainMemoConcurrent(t *testing.T) {
	c, _ := New(Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 16})
	m := newTestChainMemo(t, c, MinChainMemoBytes)
	base := testTokens(3000)
	var prompts [][]uint32
	var wants [][]uint64
	for i := 0; i < 16; i++ {
		p := append(slices.Clone(base[:200*i]), testTokens(100+i)...)
		p[len(p)-1] = uint32(i)
		prompts, wants = append(prompts, p), append(wants, Keys(c, nil, p, nil))
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var keys []uint64
			for k := 0; k < 200; k++ {
				i := (k*5 + g) % len(prompts)
				keys = m.AppendKeys(keys[:0], prompts[i], nil)
				if !slices.Equal(keys, wants[i]) {
					errs <- fmt.Sprintf("goroutine %d prompt %d: memo keys differ", g, i)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestNewChainMemoErrors(t *testing.T) {
	c := NewFast(16)
	if _, err := NewChainMemo(c, MinChainMemoBytes-1); err == nil || !strings.Contains(err.Error(), "at least") {
		t.Errorf("small bound: %v", err)
	}
	if _, err := NewChainMemo(nil, DefaultChainMemoBytes); err == nil {
		t.Error("nil chain accepted")
	}
	// Extras the contracts refuse give what the contract gives (vLLM: no keys).
	v, _ := New(Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 16})
	m := newTestChainMemo(t, v, MinChainMemoBytes)
	bad := &Extras{LoRAName: "\xff"}
	if got, want := m.AppendKeys(nil, testTokens(64), bad), Keys(v, nil, testTokens(64), bad); !slices.Equal(got, want) {
		t.Errorf("invalid extras: %v, want %v", got, want)
	}
}

// FuzzChainMemo: any prompt and follow-up, any extras, every contract: a memo (one set, so
// entries collide and evict) gives Keys' result, first and second time.
func FuzzChainMemo(f *testing.F) {
	f.Add([]byte("hello world, a prompt of a few blocks"), uint16(20), uint8(4), "lora", "salt")
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, uint16(3), uint8(1), "", "")
	var chains []Chain
	for _, spec := range memoSpecs()[:6] {
		for _, bs := range []int{1, 3, 4} {
			spec.BlockSize = bs
			c, err := New(spec)
			if err != nil {
				f.Fatal(err)
			}
			chains = append(chains, c)
		}
	}
	memos := make([]*ChainMemo, len(chains))
	for i, c := range chains {
		m, err := NewChainMemo(c, MinChainMemoBytes)
		if err != nil {
			f.Fatal(err)
		}
		m.sets = 1
		memos[i] = m
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16, which uint8, lora, salt string) {
		toks := make([]uint32, len(data))
		for i, b := range data {
			toks[i] = uint32(b) * 997
		}
		var ex *Extras
		if lora != "" || salt != "" {
			ex = &Extras{LoRAName: lora, CacheSalt: salt}
		}
		i := int(which) % len(chains)
		c, m := chains[i], memos[i]
		first := toks[:min(len(toks), int(cut))]
		for _, p := range [][]uint32{first, toks, toks} {
			if got, want := m.AppendKeys(nil, p, ex), Keys(c, nil, p, ex); !slices.Equal(got, want) {
				t.Fatalf("%s: %d tokens, extras %+v: memo keys differ", c.Name(), len(p), ex)
			}
		}
	})
}

// BenchmarkChainMemo: a ~4.7k-token prompt (293 blocks of 16) whose first ~4.3k tokens were
// memoized by the previous turn. followup: the new ~400 tokens differ every iteration (what a
// follow-up turn costs); repeat: the same prompt again (all hits); cold: Keys, no memo.
func BenchmarkChainMemo(b *testing.B) {
	const total, prev = 4700, 4300
	for _, bs := range benchSpecs {
		c, err := New(bs.spec)
		if err != nil {
			b.Fatal(err)
		}
		toks := testTokens(total)
		b.Run(bs.name+"/followup", func(b *testing.B) {
			m := newTestChainMemo(b, c, DefaultChainMemoBytes)
			keys := m.AppendKeys(nil, toks[:prev], nil)
			b.ReportAllocs()
			clk := testfix.StartCPUClock()
			turn := uint32(0)
			for b.Loop() {
				turn++
				toks[prev] = turn
				keys = m.AppendKeys(keys[:0], toks, nil)
			}
			clk.Stop(b, b.N)
		})
		b.Run(bs.name+"/repeat", func(b *testing.B) {
			m := newTestChainMemo(b, c, DefaultChainMemoBytes)
			keys := m.AppendKeys(nil, toks, nil)
			b.ReportAllocs()
			clk := testfix.StartCPUClock()
			for b.Loop() {
				keys = m.AppendKeys(keys[:0], toks, nil)
			}
			clk.Stop(b, b.N)
		})
		b.Run(bs.name+"/cold", func(b *testing.B) {
			var keys []uint64
			b.ReportAllocs()
			clk := testfix.StartCPUClock()
			for b.Loop() {
				keys = Keys(c, keys[:0], toks, nil)
			}
			clk.Stop(b, b.N)
		})
	}
}
