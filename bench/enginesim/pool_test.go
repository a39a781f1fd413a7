package enginesim

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/hashcore"
)

type recSink struct{ evs []Event }

func (r *recSink) Publish(evs []Event) {
	for _, e := range evs {
		e.Keys = slices.Clone(e.Keys)
		e.Tokens = slices.Clone(e.Tokens)
		r.evs = append(r.evs, e)
	}
}

func chain4(t testing.TB) hashcore.Chain {
	t.Helper()
	c, err := hashcore.New(hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func acquire(t *testing.T, p *Pool, c hashcore.Chain, toks []uint32, maxNew int) *Alloc {
	t.Helper()
	a, ok, err := p.Acquire(hashcore.Keys(c, nil, toks, nil), toks, maxNew, "")
	if err != nil || !ok {
		t.Fatalf("Acquire(%d tokens, %d new): ok=%v err=%v", len(toks), maxNew, ok, err)
	}
	return a
}

// The published vector from CONTRACTS.md: tokens [1,2,3,4], B=4, sha256_cbor, seed unset.
func TestPoolStoredEventCarriesEngineKey(t *testing.T) {
	c := chain4(t)
	var rec recSink
	p := NewPool(8, 4, &rec)
	a := acquire(t, p, c, []uint32{1, 2, 3, 4, 5}, 1)
	if a.CachedTokens != 0 {
		t.Fatalf("cold cache: cached %d tokens, want 0", a.CachedTokens)
	}
	if len(rec.evs) != 1 || rec.evs[0].Kind != Stored {
		t.Fatalf("events %+v, want one Stored", rec.evs)
	}
	e := rec.evs[0]
	if !slices.Equal(e.Keys, []uint64{9561501211280363793}) || e.HasParent || !slices.Equal(e.Tokens, []uint32{1, 2, 3, 4}) || e.BlockSize != 4 {
		t.Fatalf("stored %+v", e)
	}
}

func TestPoolHitCapsAtPromptMinusOne(t *testing.T) {
	c := chain4(t)
	p := NewPool(16, 4, nil)
	// 10 tokens: 2 full blocks. The second pass reuses both (8 tokens): 2 tokens remain.
	a := acquire(t, p, c, seq(100, 10), 1)
	p.Release(a)
	a = acquire(t, p, c, seq(100, 10), 1)
	if a.CachedTokens != 8 {
		t.Fatalf("10-token repeat: cached %d, want 8", a.CachedTokens)
	}
	p.Release(a)
	// 8 tokens: both blocks are cached, but the last token must be computed, so only
	// block 0 (4 tokens) is reused.
	b := acquire(t, p, c, seq(100, 8), 1)
	if b.CachedTokens != 4 {
		t.Fatalf("8-token prompt fully cached: cached %d, want 4", b.CachedTokens)
	}
	p.Release(b)
	// A prompt diverging in block 1 reuses block 0 only.
	d := append(seq(100, 4), seq(900, 6)...)
	x := acquire(t, p, c, d, 1)
	if x.CachedTokens != 4 {
		t.Fatalf("diverging prompt: cached %d, want 4", x.CachedTokens)
	}
	st := p.Stats()
	if st.QueryTokens != 10+10+8+10 || st.HitTokens != 0+8+4+4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPoolEvictsLRUTailFirst(t *testing.T) {
	c := chain4(t)
	var rec recSink
	p := NewPool(4, 4, &rec) // free queue 0,1,2,3
	A := seq(0, 8)
	B := seq(50, 8)
	ka := hashcore.Keys(c, nil, A, nil)
	kb := hashcore.Keys(c, nil, B, nil)
	// A: 8 prompt + 1 new token = 3 blocks (0,1,2); keys on 0,1. Freed tail first: 3,2,1,0.
	p.Release(acquire(t, p, c, A, 1))
	// B takes blocks 3,2,1: block 1 held A's second key, which is evicted; A's first
	// block (the shared head) survives.
	b := acquire(t, p, c, B, 1)
	if b.CachedTokens != 0 {
		t.Fatalf("B cached %d", b.CachedTokens)
	}
	if !p.Cached(ka[0]) || p.Cached(ka[1]) || !p.Cached(kb[0]) || !p.Cached(kb[1]) {
		t.Fatalf("cached: A0=%v A1=%v B0=%v B1=%v; want true false true true", p.Cached(ka[0]), p.Cached(ka[1]), p.Cached(kb[0]), p.Cached(kb[1]))
	}
	var removed []uint64
	for _, e := range rec.evs {
		if e.Kind == Removed {
			removed = append(removed, e.Keys...)
		}
	}
	if !slices.Equal(removed, []uint64{ka[1]}) {
		t.Fatalf("removed %v, want [%d]", removed, ka[1])
	}
	p.Release(b)
	a := acquire(t, p, c, A, 1)
	if a.CachedTokens != 4 {
		t.Fatalf("A again: cached %d, want 4", a.CachedTokens)
	}
}

func TestPoolRefCountsPinRunningBlocks(t *testing.T) {
	c := chain4(t)
	var rec recSink
	p := NewPool(5, 4, &rec)
	A := seq(0, 8)
	a := acquire(t, p, c, A, 1) // 3 blocks, running
	// A second request sharing block 0: reuses it (ref 2) and needs 2 fresh blocks.
	S := append(seq(0, 4), seq(70, 4)...)
	s := acquire(t, p, c, S, 1)
	if s.CachedTokens != 4 {
		t.Fatalf("shared head: cached %d, want 4", s.CachedTokens)
	}
	last := rec.evs[len(rec.evs)-1]
	ka := hashcore.Keys(c, nil, A, nil)
	if last.Kind != Stored || !last.HasParent || last.Parent != ka[0] || !slices.Equal(last.Tokens, seq(70, 4)) {
		t.Fatalf("stored after a hit must chain on the hit: %+v", last)
	}
	if st := p.Stats(); st.Free != 0 {
		t.Fatalf("free %d, want 0", st.Free)
	}
	// Nothing is free: a third request waits (ok=false), it is not an error.
	if _, ok, err := p.Acquire(nil, seq(200, 3), 1, ""); ok || err != nil {
		t.Fatalf("full pool: ok=%v err=%v, want wait", ok, err)
	}
	// Releasing A frees only the blocks nobody else holds: block 0 is still S's.
	p.Release(a)
	if st := p.Stats(); st.Free != 2 {
		t.Fatalf("after releasing A: free %d, want 2", st.Free)
	}
	if _, _, err := p.Acquire(nil, seq(0, 30), 1, ""); err != ErrTooLarge {
		t.Fatalf("31 tokens in a 20-token pool: err=%v, want ErrTooLarge", err)
	}
}

func TestPoolResetClears(t *testing.T) {
	c := chain4(t)
	var rec recSink
	p := NewPool(8, 4, &rec)
	p.Release(acquire(t, p, c, seq(0, 9), 1))
	p.Reset()
	if rec.evs[len(rec.evs)-1].Kind != Cleared {
		t.Fatalf("last event %+v, want Cleared", rec.evs[len(rec.evs)-1])
	}
	if a := acquire(t, p, c, seq(0, 9), 1); a.CachedTokens != 0 {
		t.Fatalf("after reset: cached %d", a.CachedTokens)
	}
}
