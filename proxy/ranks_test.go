package proxy

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/shard"
	"github.com/kvgate/kvgate/tokenize"
)

// The slot layout: rank 0 of endpoint i is slot i, the other ranks follow the endpoints
// in endpoint order, and each candidate's CPU and storage slots follow those.
func TestRankLayout(t *testing.T) {
	eps := []EndpointSpec{{Name: "a", DP: 1}, {Name: "b", DP: 3}, {Name: "c", DP: 2}}
	l := newRankLayout(eps, true, true)
	if l.cands != 6 || l.slots() != 18 || l.cpu != 6 || l.sto != 12 || !l.ranked || !l.tiered {
		t.Fatalf("%+v", l)
	}
	want := map[[2]int]int{{0, 0}: 0, {1, 0}: 1, {2, 0}: 2, {1, 1}: 3, {1, 2}: 4, {2, 1}: 5}
	for er, s := range want {
		if got := l.slot(er[0], er[1]); got != s || int(l.ep[s]) != er[0] || int(l.rank[s]) != er[1] {
			t.Errorf("slot(%d,%d) = %d (ep %d rank %d), want %d", er[0], er[1], got, l.ep[s], l.rank[s], s)
		}
	}
	if !slices.Equal(l.rankSlots(1), []int{3, 4}) || l.rankSlots(0) != nil {
		t.Errorf("rank slots %v %v", l.rankSlots(1), l.rankSlots(0))
	}
	if cpu, sto := l.tierSlots(1); !slices.Equal(cpu, []int{7, 9, 10}) || !slices.Equal(sto, []int{13, 15, 16}) {
		t.Errorf("tier slots %v %v", cpu, sto)
	}
	roster := make([]*endpoint, len(eps))
	for i := range eps {
		roster[i] = &endpoint{spec: eps[i]}
	}
	if lb := l.labels(roster); lb[3] != "b#1" || lb[0] != "a" || l.rankOf(0) != -1 || l.rankOf(4) != 2 {
		t.Errorf("labels %v", lb)
	}
	el := shard.NewMask(18)
	el.Set(1)
	got := l.expand(el, shard.NewMask(18))
	for s := 0; s < 18; s++ {
		if got.Has(s) != (l.ep[s] == 1) {
			t.Errorf("expanded mask slot %d: %v", s, got.Has(s))
		}
	}
	// Scores fold GPU, then the CPU past it, then storage past both.
	scores := make([]int32, 18)
	scores[1], scores[l.cpu+1], scores[l.sto+1] = 2, 5, 4
	scores[3], scores[l.sto+3] = 3, 7
	matched, cpu, sto := make([]int32, 6), make([]int32, 6), make([]int32, 6)
	l.foldTiers(scores, matched, cpu, sto)
	if matched[1] != 5 || cpu[1] != 3 || sto[1] != 0 || matched[3] != 7 || cpu[3] != 0 || sto[3] != 4 {
		t.Errorf("fold: matched %v cpu %v sto %v", matched, cpu, sto)
	}
	if plain := newRankLayout(eps[:1], false, false); plain.ranked || plain.tiered || plain.expand(el, nil)[0] != el[0] {
		t.Errorf("a rule without ranks or tiers: %+v", plain)
	}
}

func TestEndpointBlockSizeOption(t *testing.T) {
	e, err := ParseEndpoint("name=s,url=http://127.0.0.1:1,engine=sglang,block_size=1,dp=2")
	if err != nil || e.BlockSize != 1 || e.DP != 2 {
		t.Fatalf("%+v %v", e, err)
	}
	for _, bad := range []string{"block_size=0", "block_size=x", "block_size=5000"} {
		if _, err := ParseEndpoint("name=s,url=http://127.0.0.1:1," + bad); err == nil || !strings.Contains(err.Error(), "block_size") {
			t.Errorf("%s: %v", bad, err)
		}
	}
	cfg := Defaults()
	cfg.Fleet.Endpoints = []EndpointSpec{e}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.KV.TierWeightCPU = 1.5
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "-kv-tier-weight-cpu") {
		t.Errorf("weight 1.5: %v", err)
	}
}

// BenchmarkRouteKeyGroups is a whole decision (parse to select) for a ~4k-token chat
// prompt over 8 endpoints, as endpoints of other block sizes join the rule: all at 16
// (one chain), one vLLM endpoint at 32 (a second chain), one SGLang endpoint at page
// size 1 (a key per token), and one endpoint with 4 data-parallel ranks.
func BenchmarkRouteKeyGroups(b *testing.B) {
	for _, c := range []struct {
		name string
		edit func(*Config)
	}{
		{"one-contract", func(*Config) {}},
		{"plus-vllm-32", func(cfg *Config) { cfg.Fleet.Endpoints[2].BlockSize = 32 }},
		{"plus-sglang-page-1", func(cfg *Config) {
			cfg.Fleet.Endpoints[2].Engine, cfg.Fleet.Endpoints[2].BlockSize = EngineSGLang, 1
		}},
		{"plus-dp-4", func(cfg *Config) { cfg.Fleet.Endpoints[2].DP = 4 }},
		// The same prompt again with the memos on: a follow-up's keys come from each
		// group's chain memo.
		{"plus-sglang-page-1-memos", func(cfg *Config) {
			cfg.Models.TokenizeMemoBytes, cfg.KV.ChainMemoBytes = tokenize.DefaultMemoBytes, hashcore.DefaultChainMemoBytes
			cfg.Fleet.Endpoints[2].Engine, cfg.Fleet.Endpoints[2].BlockSize = EngineSGLang, 1
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, st := benchServerWith(b, chatBody4k(), func(cfg *Config) {
				cfg.Models.TokenizeMemoBytes, cfg.KV.ChainMemoBytes = 0, 0
				c.edit(cfg)
			})
			var d decision
			openai.Scan(st.body, &st.oa)
			s.decide(st, &d, false) // warm: pooled buffers, a group's memo made on first use
			b.ReportAllocs()
			for b.Loop() {
				openai.Scan(st.body, &st.oa)
				s.decide(st, &d, false)
			}
			b.ReportMetric(float64(st.ngroups+1), "chains")
		})
	}
}

// A fleet too wide for tier slots routes on GPU blocks, with a WARN; one whose ranks
// alone exceed the inventory is refused naming -endpoint.
func TestWideFleetSlots(t *testing.T) {
	specs := make([]string, 400)
	for i := range specs {
		specs[i] = fmt.Sprintf("name=e%d,url=http://127.0.0.1:%d,engine=vllm,events=tcp://127.0.0.1:%d", i, 20000+i, 30000+i)
	}
	cfg := kvConfig(t, KVConverged, specs...)
	var logs strings.Builder
	s, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Tokenizers: sharedPool(t)})
	if err != nil {
		t.Fatal(err)
	}
	// 400 endpoints take a slot table of 448 (fleet.go slotsFor): too wide for tier slots.
	if s.ranks.tiered || s.kv.inv.Endpoints() != 448 || len(s.roster().eps) != 448 || !strings.Contains(logs.String(), "lower-tier blocks are not indexed") {
		t.Fatalf("tiered %v, inventory %d slots, log %s", s.ranks.tiered, s.kv.inv.Endpoints(), logs.String())
	}
	cfg.Fleet.Endpoints[0].DP = 700
	if _, err := New(cfg, Options{Logger: quietLog, Tokenizers: sharedPool(t)}); err == nil || !strings.Contains(err.Error(), "-endpoint") {
		t.Fatalf("1,099 candidates: %v", err)
	}
}

// The trie (what kvgate sent where, mode 3's pending entries) scores candidates only:
// scratch left by scoring the tier slots must not reach it. Regression: with re-hashed
// keys, a CPU copy of the prompt on one endpoint and the pending trie on, the second
// decision panicked indexing a tier slot.
func TestTrieIgnoresTierSlots(t *testing.T) {
	s, st := benchServerWith(t, chatBody4k(), func(cfg *Config) {
		cfg.Models.TokenizeMemoBytes, cfg.KV.ChainMemoBytes = 0, 0
		cfg.KV.Keys = "rehash"
	})
	if s.kv.trie == nil || !s.ranks.tiered {
		t.Fatal("want the pending trie and tier slots")
	}
	st.body = append(st.body[:0], complPrompt(sharedPrefix)...)
	st.chat = false
	toks := engineTokens(t, sharedPrefix)
	fast := hashcore.Keys(s.kv.fast, nil, toks, nil)
	s.kv.inv.Add(s.ranks.cpu+4, fast[:2]) // the trie will hold more: it is asked
	var d decision
	for i := 0; i < 3; i++ {
		if err := openai.Scan(st.body, &st.oa); err != nil {
			t.Fatal(err)
		}
		s.decide(st, &d, false)
		if d.ep != 4 || d.slot != 4 || d.route != RouteKVHit {
			t.Fatalf("decision %d: ep %d slot %d route %v", i, d.ep, d.slot, d.route)
		}
	}
}

// A key group of another contract (an SGLang endpoint at page size 1) hashes a follow-up
// through its own chain memo: the second decision takes the prompt's keys from it, and
// they are the keys the contract computes.
func TestKeyGroupMemo(t *testing.T) {
	s, st := benchServerWith(t, chatBody4k(), func(cfg *Config) {
		cfg.Fleet.Endpoints[2].Engine, cfg.Fleet.Endpoints[2].BlockSize = EngineSGLang, 1
	})
	var d decision
	for i := 0; i < 2; i++ {
		if err := openai.Scan(st.body, &st.oa); err != nil {
			t.Fatal(err)
		}
		s.decide(st, &d, false)
	}
	if st.ngroups != 1 {
		t.Fatalf("%d key groups, want the SGLang endpoint's", st.ngroups)
	}
	g := st.groups[0]
	v, ok := s.kv.groupMemos.Load(g.chain)
	if !ok || v.(*groupMemo).m == nil {
		t.Fatal("no memo for the SGLang group")
	}
	if hits := v.(*groupMemo).m.Stats().Hits; hits < uint64(len(st.tokens))/2 {
		t.Fatalf("memo hits %d for a %d-token follow-up", hits, len(st.tokens))
	}
	if want := hashcore.Keys(g.chain, nil, st.tokens, nil); !slices.Equal(g.keys, want) {
		t.Fatalf("memoized keys differ from the contract's (%d vs %d)", len(g.keys), len(want))
	}
}
