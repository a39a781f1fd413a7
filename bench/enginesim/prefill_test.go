package enginesim

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeClock drives a sharedPrefill's virtual time by hand; the real timer it also arms
// only re-reads this clock, so finishes happen exactly when the test calls fire.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) set(d time.Duration) {
	c.mu.Lock()
	c.t = time.Unix(0, 0).Add(d)
	c.mu.Unlock()
}

func startJob(t *testing.T, p *sharedPrefill, ctx context.Context, work time.Duration, wantActive int) <-chan bool {
	t.Helper()
	done := make(chan bool, 1)
	go func() { done <- p.run(ctx, work) }()
	deadline := time.Now().Add(5 * time.Second)
	for p.active() != wantActive {
		if time.Now().After(deadline) {
			t.Fatalf("job never joined: %d active, want %d", p.active(), wantActive)
		}
		time.Sleep(time.Millisecond)
	}
	return done
}

func finished(ch <-chan bool) bool {
	select {
	case <-ch:
		return true
	case <-time.After(20 * time.Millisecond):
		return false
	}
}

// A (300 ms of work) starts alone at 0; B (100 ms) joins at 100 ms. Shared equally, B is
// done at 300 ms (100 ms of work at half rate) and A, 200 ms in by then, at 400 ms. In
// parallel B would end at 200 and A at 300; first-come first-served, A at 300, B at 400.
func TestSharedPrefillSplitsComputeEqually(t *testing.T) {
	clk := &fakeClock{}
	clk.set(0)
	p := newSharedPrefill()
	p.now = clk.now
	ctx := context.Background()
	a := startJob(t, p, ctx, 300*time.Millisecond, 1)
	clk.set(100 * time.Millisecond)
	b := startJob(t, p, ctx, 100*time.Millisecond, 2)
	for _, step := range []struct {
		at           time.Duration
		aDone, bDone bool
	}{{200 * time.Millisecond, false, false}, {299 * time.Millisecond, false, false}, {300 * time.Millisecond, false, true},
		{399 * time.Millisecond, false, true}, {400 * time.Millisecond, true, true}} {
		clk.set(step.at)
		p.fire()
		if step.bDone && b != nil {
			if !finished(b) {
				t.Fatalf("at %v: B not finished", step.at)
			}
			b = nil
		} else if b != nil && finished(b) {
			t.Fatalf("at %v: B finished early", step.at)
		}
		if step.aDone {
			if !finished(a) {
				t.Fatalf("at %v: A not finished", step.at)
			}
		} else if finished(a) {
			t.Fatalf("at %v: A finished early", step.at)
		}
	}
	if p.active() != 0 {
		t.Fatalf("%d jobs left", p.active())
	}
}

// A request whose client leaves gives its share back: the other finishes as if alone
// from then on.
func TestSharedPrefillLeaverFreesItsShare(t *testing.T) {
	clk := &fakeClock{}
	clk.set(0)
	p := newSharedPrefill()
	p.now = clk.now
	ctx, cancel := context.WithCancel(context.Background())
	a := startJob(t, p, context.Background(), 200*time.Millisecond, 1)
	b := startJob(t, p, ctx, 200*time.Millisecond, 2)
	clk.set(100 * time.Millisecond) // both have 50 ms of work done
	cancel()
	if ok := <-b; ok {
		t.Fatal("cancelled job reported done")
	}
	// A alone needs 150 ms more: done at 250 ms, not at 400 (shared to the end).
	clk.set(249 * time.Millisecond)
	p.fire()
	if finished(a) {
		t.Fatal("A finished before 250 ms")
	}
	clk.set(250 * time.Millisecond)
	p.fire()
	if !finished(a) {
		t.Fatal("A not finished at 250 ms")
	}
}

// timeTwo sends two equal 1-output-token requests at once and returns when each answered.
func timeTwo(t *testing.T, s *Sim) [2]time.Duration {
	var got [2]time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			code, b, _ := post(t, s.URL()+"/v1/completions", `{"prompt":`+ids(1000*i, 200)+`,"max_tokens":1}`)
			if code != 200 {
				t.Errorf("HTTP %d: %s", code, b)
			}
			got[i] = time.Since(start)
		}(i)
	}
	wg.Wait()
	return got
}

// Over HTTP, with real time: two equal 200 ms prefills started together both take about
// 400 ms shared, about 200 ms in parallel. The bounds leave room for a busy machine but
// not for the other model.
func TestPrefillSharedOverHTTP(t *testing.T) {
	sp := Spec{BlockSize: 4, NumBlocks: 512, MaxBatch: 8, PrefillPerToken: time.Millisecond} // 200 tokens: 200 ms
	par := timeTwo(t, launch(t, sp))
	sp.PrefillShared = true
	shr := timeTwo(t, launch(t, sp))
	for i := 0; i < 2; i++ {
		if par[i] < 190*time.Millisecond || par[i] > 330*time.Millisecond {
			t.Errorf("parallel prefill %d took %v, want ~200ms", i, par[i])
		}
		if shr[i] < 390*time.Millisecond || shr[i] > 560*time.Millisecond {
			t.Errorf("shared prefill %d took %v, want ~400ms", i, shr[i])
		}
	}
	if t.Failed() {
		t.Logf("parallel %v, shared %v", par, shr)
	}
}
