//go:build !race

// The race detector changes allocation behaviour (sync.Pool drops items on purpose), so
// allocation counts are proved in normal builds only.

package proxy

import (
	"testing"

	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/tokenize"
)

// Steps 1-5 of the request path (parse, template, tokenize, hash, score, select)
// allocate nothing in steady state.
func TestRoutingZeroAlloc(t *testing.T) {
	body := chatBody4k()
	s, st := benchServer(t, body)
	var d decision
	route := func() {
		if err := openai.Scan(st.body, &st.oa); err != nil {
			t.Fatal(err)
		}
		s.decide(st, &d, false)
	}
	route()
	if d.ep != 3 || d.route != RouteKVHit {
		t.Fatalf("decision ep=%d route=%v (tokens %d)", d.ep, d.route, len(st.tokens))
	}
	if len(st.tokens) < 3500 {
		t.Fatalf("prompt has %d tokens, want about 4k", len(st.tokens))
	}
	// The chat template renderer (tokenize/chat) is measured alone: kvgate's own
	// steps must add nothing to whatever it needs.
	m := sharedPool(t).Get("qwen3")
	in := &tokenize.ChatInput{Messages: st.oa.Value[openai.FMessages].Bytes(st.body),
		TemplateKwargs: st.oa.Value[openai.FChatTemplateKwargs].Bytes(st.body), AddGenerationPrompt: true}
	toks := make([]uint32, 0, 8192)
	tmplAllocs := testing.AllocsPerRun(20, func() { toks, _ = m.EncodeChat(toks, in) })
	if n := testing.AllocsPerRun(20, route); n != tmplAllocs {
		t.Errorf("routing allocates %v per request; the template+tokenizer alone %v", n, tmplAllocs)
	}
	if tmplAllocs != 0 {
		t.Logf("note: tokenize.EncodeChat allocates %v per call (owned by tokenize/chat)", tmplAllocs)
	}
	// The completions path and the miss path (rr fallback) too.
	st.body = append(st.body[:0], complPrompt(sharedPrefix)...)
	st.chat = false
	route()
	if n := testing.AllocsPerRun(20, route); n != 0 {
		t.Errorf("completions routing allocates %v per request (route %v)", n, d.route)
	}
}

// Data-parallel ranks (candidates per rank) and an endpoint of another block size (a
// key group of its own) allocate nothing either, once warm.
func TestRoutingZeroAllocRanksAndGroups(t *testing.T) {
	s, st := benchServerWith(t, chatBody4k(), func(cfg *Config) {
		cfg.Models.TokenizeMemoBytes, cfg.KV.ChainMemoBytes = 0, 0
		cfg.Fleet.Endpoints[1].DP = 2
		cfg.Fleet.Endpoints[2].BlockSize = 32
	})
	toks := engineTokens(t, sharedPrefix)
	keys := hashcore.Keys(s.kv.chain, nil, toks, nil)
	rank1 := s.ranks.slot(1, 1)
	s.kv.inv.Add(rank1, keys)
	c32, _ := s.kv.mgr.Contract(2)
	if c32 == nil || c32.BlockSize() != 32 {
		t.Fatalf("endpoint 2's contract %v", c32)
	}
	s.kv.inv.Add(2, hashcore.Keys(c32, nil, toks, nil)[:1])
	var d decision
	st.body = append(st.body[:0], complPrompt(sharedPrefix)...)
	st.chat = false
	route := func() {
		if err := openai.Scan(st.body, &st.oa); err != nil {
			t.Fatal(err)
		}
		s.decide(st, &d, false)
	}
	route()
	if d.ep != 1 || d.rank != 1 || d.slot != rank1 || d.route != RouteKVHit || st.ngroups != 1 || st.scores[2] != 2 {
		t.Fatalf("decision ep=%d rank=%d slot=%d route=%v groups=%d score(e2)=%d", d.ep, d.rank, d.slot, d.route, st.ngroups, st.scores[2])
	}
	if n := testing.AllocsPerRun(20, route); n != 0 {
		t.Errorf("routing over ranks and key groups allocates %v per request", n)
	}
}

// A follow-up turn (BenchmarkRouteFollowup's: the memos on, every earlier turn routed
// before, the last message new text each time) allocates nothing per request: what it
// stores of the new turn goes into the memos' slabs and ring, whole slabs at a time, so
// over a run of turns that is under one allocation a request (AllocsPerRun's measure).
func TestFollowupZeroAlloc(t *testing.T) {
	body, at := followupBody()
	s, st := benchServerWith(t, body, func(*Config) {})
	var d decision
	n := 0
	turn := func() {
		for k, m := 6, n; k >= 0; k-- {
			st.body[at+k] = byte('0' + m%10)
			m /= 10
		}
		n++
		if err := openai.Scan(st.body, &st.oa); err != nil {
			t.Fatal(err)
		}
		clear(st.excluded)
		s.decide(st, &d, false)
	}
	for range 100 {
		turn()
	}
	notes := s.kv.memo.Stats().Notes
	if a := testing.AllocsPerRun(2000, turn); a != 0 {
		t.Errorf("a follow-up turn allocates %v times", a)
	}
	if s.kv.memo.Stats().Notes == notes || st.memoBlocks == 0 {
		t.Errorf("the follow-ups took no token notes (%d) or chain memo blocks (%d)", s.kv.memo.Stats().Notes-notes, st.memoBlocks)
	}
}
