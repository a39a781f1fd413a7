package hashcore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// Concurrent writers on a memo small enough that every set evicts: prompts that share
// openings under different extras (LoRA name, cache salt), with block-unaligned lengths,
// must get exactly the uncached chain's keys on every call.
func TestChainMemoConcurrentEvictionExtras(t *testing.T) {
	for _, spec := range []Spec{{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 5}, {Engine: "sglang", BlockSize: 16}, {Engine: "kvgate", BlockSize: 3}} {
		t.Run(fmt.Sprintf("%s-%d", spec.Engine, spec.BlockSize), func(t *testing.T) {
			c, err := New(spec)
			if err != nil {
				t.Fatal(err)
			}
			m := newTestChainMemo(t, c, MinChainMemoBytes)
			base := testTokens(4000)
			type job struct {
				toks []uint32
				ex   *Extras
				want []uint64
			}
			var jobs []job
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 48; i++ {
				n := rng.IntN(len(base))
				toks := slices.Clone(base[:n])
				if i%3 == 0 && n > 0 {
					toks[rng.IntN(n)] ^= 7
				}
				ex := memoExtras[i%len(memoExtras)]
				jobs = append(jobs, job{toks, ex, Keys(c, nil, toks, ex)})
			}
			var wg sync.WaitGroup
			errs := make(chan string, 4)
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					var keys []uint64
					for k := 0; k < 150; k++ {
						j := jobs[(k*7+g*13)%len(jobs)]
						if keys = m.AppendKeys(keys[:0], j.toks, j.ex); !slices.Equal(keys, j.want) {
							errs <- fmt.Sprintf("goroutine %d: %d tokens, extras %+v: memo keys differ", g, len(j.toks), j.ex)
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
			if st := m.Stats(); st.Evictions == 0 || st.Hits == 0 {
				t.Logf("memo not fully exercised: %+v", st)
			}
		})
	}
}
