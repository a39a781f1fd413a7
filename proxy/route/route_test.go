package route

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvgate/kvgate/proxy/balance"
	"github.com/kvgate/kvgate/shard"
)

func candidates(n int, matched []int32, tokens int) *Candidates {
	el := shard.NewMask(n)
	best := -1
	for i := 0; i < n; i++ {
		el.Set(i)
		if matched[i] > 0 && (best < 0 || matched[i] > matched[best]) {
			best = i
		}
	}
	return &Candidates{Eligible: el, Matched: matched, Best: best, Tokens: tokens, BlockSize: 16, MinBlocks: 1}
}

type recorder map[int]Terms

func (r recorder) Endpoint(ep int, t Terms) { r[ep] = t }

func TestCostPrefersHolderWhenIdle(t *testing.T) {
	q := NewQueues(4, 10000, 0, time.Second)
	c := &Cost{Loads: balance.NewLoads(4), Queues: q}
	cd := candidates(4, []int32{0, 120, 0, 0}, 2048)
	for k := 0; k < 8; k++ {
		if got := c.Select(cd, nil); got != 1 {
			t.Fatalf("idle pool: got %d, want the holder 1", got)
		}
	}
}

func TestCostSpreadsWhenHolderQueueCostsMore(t *testing.T) {
	q := NewQueues(2, 10000, 0, time.Second)
	loads := balance.NewLoads(2)
	c := &Cost{Loads: loads, Queues: q}
	// 992 of 2,048 tokens cached at endpoint 0, but a 20,000-token prompt prefilling there:
	// the remaining 1,056 share the GPU with it (105.6 ms each way: its own wait and the
	// delay it adds), while the idle endpoint 1 prefills all 2,048 in 204.8 ms alone.
	tk := q.Sent(0, 20000)
	loads.Inc(0)
	cd := candidates(2, []int32{62, 0}, 2048)
	obs := recorder{}
	if got := c.Select(cd, obs); got != 1 {
		t.Fatalf("got %d, want the idle endpoint 1; terms %+v", got, obs)
	}
	if obs[0].Queued != 20000 || obs[0].Uncached != 2048-62*16 || obs[1].Uncached != 2048 {
		t.Fatalf("terms %+v", obs)
	}
	if math.Abs(obs[1].Cost-204.8) > 0.01 || math.Abs(obs[0].Predicted-211.2) > 0.01 || math.Abs(obs[0].Cost-316.8) > 0.01 {
		t.Fatalf("predicted ms %+v", obs)
	}
	// Once the queue drains the holder wins again.
	q.FirstToken(0, 20000, time.Second, tk)
	loads.Dec(0)
	if got := c.Select(cd, nil); got != 0 {
		t.Fatalf("drained: got %d, want the holder 0", got)
	}
}

func TestCostTiesRotateThenLoad(t *testing.T) {
	q := NewQueues(4, 0, 0, time.Second)
	loads := balance.NewLoads(4)
	c := &Cost{Loads: loads, Queues: q}
	cd := candidates(4, []int32{0, 0, 0, 0}, 512)
	seen := map[int]int{}
	for k := 0; k < 40; k++ {
		seen[c.Select(cd, nil)]++
	}
	for i := 0; i < 4; i++ {
		if seen[i] != 10 {
			t.Fatalf("equal endpoints must rotate evenly: %v", seen)
		}
	}
	// A tie broken by load: endpoint 2 has the fewest in flight.
	for i := 0; i < 4; i++ {
		if i != 2 {
			loads.Inc(i)
		}
	}
	for k := 0; k < 8; k++ {
		if got := c.Select(cd, nil); got != 2 {
			t.Fatalf("tie by load: got %d, want 2", got)
		}
	}
}

func TestCostShallowMatchIsNoCredit(t *testing.T) {
	q := NewQueues(2, 10000, 0, time.Second)
	c := &Cost{Loads: balance.NewLoads(2), Queues: q}
	cd := candidates(2, []int32{2, 0}, 4096)
	cd.MinBlocks = 4
	obs := recorder{}
	c.Select(cd, obs)
	if obs[0].Uncached != 4096 {
		t.Fatalf("a match under -kv-min-match-tokens must not count: %+v", obs[0])
	}
}

func TestSlotWaitFromEngineReport(t *testing.T) {
	q := NewQueues(2, 10000, 0, time.Second)
	loads := balance.NewLoads(2)
	c := &Cost{Loads: loads, Queues: q}
	now := time.Now()
	q.Finished(0, Ticket{}, 400*time.Millisecond, 0, false)
	q.Finished(1, Ticket{}, 400*time.Millisecond, 0, false)
	// Endpoint 0 runs 8 and has 8 waiting (requests of another replica): a new request
	// waits behind 9 slot releases of 400ms/8 each.
	q.Observe(0, Report{Running: 8, Waiting: 8, KVUsage: 0.5}, 0, now)
	q.Observe(1, Report{Running: 2, Waiting: 0, KVUsage: 0.1}, 0, now)
	ahead, eng := q.Ahead(0, 0, now)
	if ahead != 9 || !eng {
		t.Fatalf("ahead %d engine %v", ahead, eng)
	}
	var tm Terms
	q.Predict(&tm, 0, 32, 0, now)
	want := (32.0/10000 + 9*0.4/8) * 1000
	if math.Abs(tm.Predicted-want) > 0.01 || tm.Source != "engine" {
		t.Fatalf("predicted %+v, want %.2f ms", tm, want)
	}
	cd := candidates(2, []int32{100, 0}, 1632)
	if got := c.Select(cd, nil); got != 1 {
		t.Fatalf("the holder's slot queue costs 450 ms, a full prefill 163 ms: got %d", got)
	}
	// Requests kvgate sends after the report count on top of it; finished ones come off.
	if a, _ := q.Ahead(1, 7, now); a != 0 {
		t.Fatalf("slots unknown (the engine never queued): ahead %d, want 0", a)
	}
	q.Observe(1, Report{Running: 8, Waiting: 1}, 0, now)
	q.Observe(1, Report{Running: 2, Waiting: 0}, 0, now)
	if a, _ := q.Ahead(1, 7, now); a != 2 {
		t.Fatalf("2 running + 7 sent since, slots 8: ahead %d, want 2", a)
	}
	// A stale report decays to kvgate's own accounting.
	later := now.Add(2 * time.Second)
	if q.Fresh(0, later) {
		t.Fatal("report should be stale")
	}
	if a, eng := q.Ahead(0, 3, later); a != 0 || eng {
		t.Fatalf("stale: ahead %d engine %v", a, eng)
	}
	if a, _ := q.Ahead(0, 9, later); a != 2 {
		t.Fatalf("stale, 9 in flight over 8 learned slots: ahead %d, want 2", a)
	}
}

func TestRateFitLearnsLine(t *testing.T) {
	q := NewQueues(1, 0, 0, time.Second)
	// An endpoint at 4,000 tokens/s with 12 ms fixed cost.
	for k := 0; k < 60; k++ {
		unc := 100 + (k*397)%3000
		ttft := time.Duration((0.012 + float64(unc)/4000) * float64(time.Second))
		tk := q.Sent(0, unc)
		if !tk.alone {
			t.Fatal("nothing else queued")
		}
		q.FirstToken(0, unc, ttft, tk)
	}
	v := q.View(0, time.Now())
	if math.Abs(v.Rate-4000) > 40 || math.Abs(v.BaseMs-12) > 0.5 {
		t.Fatalf("fit rate %.1f base %.2f ms, want 4000 and 12", v.Rate, v.BaseMs)
	}
	if v.QueuedTokens != 0 {
		t.Fatalf("queued %d after every first token", v.QueuedTokens)
	}
}

func TestRateFitIgnoresQueuedSamples(t *testing.T) {
	q := NewQueues(1, 0, 0, time.Second)
	a := q.Sent(0, 1000)
	b := q.Sent(0, 1000)
	if !a.alone || b.alone {
		t.Fatalf("alone %v %v", a, b)
	}
	q.FirstToken(0, 1000, 10*time.Second, b) // waited behind a: not a sample
	q.FirstToken(0, 1000, 10*time.Second, a) // b shared its prefill: not a sample
	if v := q.View(0, time.Now()); v.RateSamples != 0 || v.Rate != PriorRate {
		t.Fatalf("%+v", v)
	}
	c := q.Sent(0, 1000)
	q.FirstToken(0, 1000, 110*time.Millisecond, c)
	if v := q.View(0, time.Now()); v.RateSamples != 1 {
		t.Fatalf("a request alone is a sample: %+v", v)
	}
}

func TestPinnedRate(t *testing.T) {
	q := NewQueues(1, 2500, 0, time.Second)
	for k := 0; k < 20; k++ {
		unc := 200 + k*300
		q.FirstToken(0, unc, time.Duration(unc)*time.Millisecond, q.Sent(0, unc))
		if k == 19 && q.View(0, time.Now()).RateSamples != 0 {
			t.Fatal("a pinned rate takes no samples")
		}
	}
	if v := q.View(0, time.Now()); v.Rate != 2500 {
		t.Fatalf("a pinned rate must not move: %+v", v)
	}
}

func TestOverlapArgmaxAndBound(t *testing.T) {
	loads := balance.NewLoads(3)
	o := &Overlap{Loads: loads, LoadFactor: 0.25}
	cd := candidates(3, []int32{3, 9, 5}, 1024)
	if got := o.Select(cd, nil); got != 1 {
		t.Fatalf("got %d", got)
	}
	for k := 0; k < 4; k++ {
		loads.Inc(1)
	}
	if got := o.Select(cd, nil); got != 2 {
		t.Fatalf("over the bound the next-best holder wins: got %d", got)
	}
}

func TestCostSelectAllocatesNothing(t *testing.T) {
	c, cd := productionCost()
	if a := testing.AllocsPerRun(1000, func() { c.Select(cd, nil) }); a != 0 {
		t.Fatalf("Select allocates %.1f per call", a)
	}
	if a := testing.AllocsPerRun(1000, func() { c.Popular.Record(cd.Blocks, time.Now()) }); a != 0 {
		t.Fatalf("Popularity.Record allocates %.1f per call", a)
	}
}

// productionCost is the cost policy as kvgate serve builds it (fair share and the
// followers sketch on) over 8 endpoints, with a 4,096-token prompt.
func productionCost() (*Cost, *Candidates) {
	q := NewQueues(8, 0, 0, time.Second)
	c := &Cost{Loads: balance.NewLoads(8), Queues: q, Popular: NewPopularity(16), FairShare: DefaultFairShare}
	for i := 0; i < 8; i++ {
		q.Sent(i, 1000*(i+1))
	}
	cd := candidates(8, []int32{1, 5, 0, 9, 0, 0, 2, 0}, 4096)
	cd.Blocks = chain(1, 200, 256, 2)
	c.Popular.Record(cd.Blocks, time.Now())
	return c, cd
}

func BenchmarkCostSelect(b *testing.B) {
	c, cd := productionCost()
	b.ReportAllocs()
	for b.Loop() {
		c.Select(cd, nil)
	}
}

// BenchmarkPopularityRecord: what counting one 4,096-token prompt's followers costs.
func BenchmarkPopularityRecord(b *testing.B) {
	c, cd := productionCost()
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		c.Popular.Record(cd.Blocks, now)
	}
}

func TestDecodeByEngineReport(t *testing.T) {
	q := NewQueues(3, 0, 0, time.Second)
	loads := balance.NewLoads(3)
	d := &Decode{Loads: loads, Queues: q}
	el := shard.NewMask(3)
	for i := 0; i < 3; i++ {
		el.Set(i)
	}
	now := time.Now()
	// kvgate has nothing in flight anywhere, but the engines report their own load
	// (another replica's decodes): 0 runs 12, 1 runs 3 with a full KV cache, 2 runs 5.
	q.Observe(0, Report{Running: 12, KVUsage: 0.5}, 0, now)
	q.Observe(1, Report{Running: 3, KVUsage: 0.97}, 0, now)
	q.Observe(2, Report{Running: 5, KVUsage: 0.6}, 0, now)
	for k := 0; k < 6; k++ {
		if got := d.Select(el); got != 2 {
			t.Fatalf("want 2 (fewest running with room), got %d", got)
		}
	}
	// Requests kvgate sends after the report count on top of it.
	for k := 0; k < 8; k++ {
		loads.Inc(2)
	}
	if got := d.Select(el); got != 0 {
		t.Fatalf("2 now runs 13: want 0, got %d", got)
	}
	// Every cache full: the fewest running wins anyway.
	q.Observe(0, Report{Running: 12, KVUsage: 0.99}, 0, now)
	q.Observe(2, Report{Running: 5, KVUsage: 0.99}, 8, now)
	if got := d.Select(el); got != 1 {
		t.Fatalf("all full: want 1 (3 running), got %d", got)
	}
	// Stale reports: kvgate's own in-flight counts, rotating on ties.
	d2 := &Decode{Loads: balance.NewLoads(3), Queues: NewQueues(3, 0, 0, time.Second)}
	seen := map[int]int{}
	for k := 0; k < 30; k++ {
		seen[d2.Select(el)]++
	}
	if seen[0] != 10 || seen[1] != 10 || seen[2] != 10 {
		t.Fatalf("ties rotate: %v", seen)
	}
}

// An endpoint on a GPU half as fast is measured as such and, holding the same prefix as a
// fast one, gets about half the concurrent work: each request goes where its predicted
// first token is soonest, and queued prefill costs the slow endpoint twice as long.
func TestSlowerEndpointGetsProportionallyLess(t *testing.T) {
	q := NewQueues(2, 0, 0, time.Second)
	loads := balance.NewLoads(2)
	c := &Cost{Loads: loads, Queues: q}
	for k := 0; k < 40; k++ { // each endpoint's own first tokens, alone: 8k and 4k tokens/s
		unc := 200 + (k*331)%2000
		for ep, rate := range []float64{8000, 4000} {
			q.FirstToken(ep, unc, time.Duration((0.002+float64(unc)/rate)*float64(time.Second)), q.Sent(ep, unc))
		}
	}
	if r0, r1 := q.View(0, time.Now()).Rate, q.View(1, time.Now()).Rate; math.Abs(r0-8000) > 80 || math.Abs(r1-4000) > 40 {
		t.Fatalf("learned %.0f and %.0f tokens/s", r0, r1)
	}
	// 300 requests in flight at once, each holding 512 of 1,536 tokens on both endpoints.
	cd := candidates(2, []int32{32, 32}, 1536)
	got := [2]int{}
	for k := 0; k < 300; k++ {
		ep := c.Select(cd, nil)
		got[ep]++
		q.Sent(ep, 1024)
		loads.Inc(ep)
	}
	if ratio := float64(got[0]) / float64(got[1]); ratio < 1.8 || ratio > 2.2 {
		t.Fatalf("fast/slow split %v (ratio %.2f), want about 2", got, ratio)
	}
}

// A streamed request's slot time is its own prefill plus its decode, not the time it
// waited for the slot: a wait estimate built on waits would feed on itself.
func TestServiceIsSlotTime(t *testing.T) {
	q := NewQueues(1, 10000, 0, time.Second)
	tk := q.Sent(0, 1000) // 100 ms of prefill
	q.FirstToken(0, 1000, 900*time.Millisecond, tk)
	q.Finished(0, tk, time.Second+900*time.Millisecond, time.Second, true) // waited 800 ms, decoded 1 s
	if v := q.View(0, time.Now()); math.Abs(v.ServiceMs-1100) > 0.01 {
		t.Fatalf("slot time %.1f ms, want 1100", v.ServiceMs)
	}
	q2 := NewQueues(1, 10000, 0, time.Second)
	tk = q2.Sent(0, 1000)
	tk.NoSample() // a whole answer: sent-to-end is all there is
	q2.FirstToken(0, 1000, 2*time.Second, tk)
	q2.Finished(0, tk, 2*time.Second, 0, true)
	if v := q2.View(0, time.Now()); math.Abs(v.ServiceMs-2000) > 0.01 {
		t.Fatalf("whole answer %.1f ms, want 2000", v.ServiceMs)
	}
}

// Prefill is processor-shared: a cached follow-up behind a long prefill waits for about
// its own tokens' worth of the other's work, not all of it; a full prefill waits for the
// whole queue.
func TestPredictSharesPrefill(t *testing.T) {
	q := NewQueues(1, 10000, 0, time.Second)
	q.Sent(0, 20000)
	q.Sent(0, 30000)
	now := time.Now()
	var small, big Terms
	q.Predict(&small, 0, 100, 2, now) // 100 own + 2 x 100 of the others'
	if math.Abs(small.Predicted-30) > 0.01 || math.Abs(small.Delays-20) > 0.01 || small.Waiting != 2 {
		t.Fatalf("small %+v", small)
	}
	q.Predict(&big, 0, 40000, 2, now) // all 50,000 queued tokens first
	if math.Abs(big.Predicted-9000) > 0.01 || math.Abs(big.Delays-5000) > 0.01 {
		t.Fatalf("big %+v", big)
	}
}

func TestRuleSelectors(t *testing.T) {
	loads := balance.NewLoads(4)
	rr := &RR{RR: balance.NewRR(4)}
	ch := &CHWBL{Ring: balance.NewRing([]string{"a", "b", "c", "d"}, []int{1, 1, 1, 1}), Loads: loads, LoadFactor: 0, RR: balance.NewRR(4)}
	el := shard.NewMask(4)
	el.SetAll(4)
	c := &Candidates{Eligible: el, Key: 0xfeedface}
	seen := map[int]bool{}
	for k := 0; k < 8; k++ {
		seen[rr.Select(c, nil)] = true
	}
	if len(seen) != 4 {
		t.Fatalf("rr visits every endpoint: %v", seen)
	}
	first := ch.Select(c, nil)
	for k := 0; k < 4; k++ {
		if got := ch.Select(c, nil); got != first {
			t.Fatalf("chwbl is sticky per key: %d then %d", first, got)
		}
	}
	loads.Inc(first) // over ceil(1 x 2/4) = 1: the next endpoint on the ring takes it
	if got := ch.Select(c, nil); got == first || got < 0 {
		t.Fatalf("chwbl over its bound: got %d (first %d)", got, first)
	}
}

// fleetCost is the cost policy over a 1,024-endpoint fleet where three endpoints hold
// some of an 8,192-token prompt (the fleet bench's decision): endpoint 5 the most, 384
// blocks. shared makes its prefix a shared one (more recent followers than its copy
// costs) and the fleet's recent work even enough that endpoint 5 stays within its fair
// share: then its share decides whether it competes, and every endpoint's work is summed.
func fleetCost(shared bool) (*Cost, *Candidates) {
	const n = 1024
	q := NewQueues(n, 0, 0, time.Second)
	c := &Cost{Loads: balance.NewLoads(n), Queues: q, Popular: NewPopularity(16), FairShare: DefaultFairShare}
	matched := make([]int32, n)
	matched[5], matched[300], matched[900] = 384, 256, 128
	for i := 0; i < n; i++ {
		if shared { // recent work that is done: an even share, no queue
			q.FirstToken(i, 20000, time.Second, q.Sent(i, 20000))
		}
		q.Sent(i, 100*(i%7))
	}
	cd := candidates(n, matched, 8192)
	cd.Blocks = chain(1, 512, 512, 2)
	for k := 0; k < 1+9*btoi(shared); k++ {
		c.Popular.Record(cd.Blocks, time.Now())
	}
	return c, cd
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// BenchmarkCostSelectFleet: the cost policy over fleetCost's 1,024 endpoints, the
// holder's prefix private (a conversation's history) or shared.
func BenchmarkCostSelectFleet(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "private", true: "shared"}[shared], func(b *testing.B) {
			c, cd := fleetCost(shared)
			if w := c.Select(cd, nil); w != 5 {
				b.Fatalf("winner %d, want 5", w)
			}
			b.ReportAllocs()
			for b.Loop() {
				c.Select(cd, nil)
			}
		})
	}
}

// TestCostSelectFleetAllocatesNothing: BenchmarkCostSelectFleet's 0 allocs/op, on both
// of the clear-winner test's paths (a private holder: no share; a shared one: the sum).
func TestCostSelectFleetAllocatesNothing(t *testing.T) {
	for _, shared := range []bool{false, true} {
		c, cd := fleetCost(shared)
		var obs recorder = map[int]Terms{}
		c.selectAt(cd, obs, 0, time.Now(), true)
		if private := obs[5].Followers*int64(obs[5].Uncached) < 384*16; private == shared || shared && obs[5].OverShare {
			t.Fatalf("shared %v: endpoint 5 %+v: the case does not take the path it names", shared, obs[5])
		}
		if a := testing.AllocsPerRun(1000, func() { c.Select(cd, nil) }); a != 0 {
			t.Fatalf("shared %v: Select allocates %.1f per call", shared, a)
		}
	}
}

// TestCostPrunedMatchesFullScan: the pruned scan (selectPruned, the in-scan floors)
// decides as the scan that evaluates every candidate does, over random fleets: sizes up
// to 1,024, few or many holders, equal endpoints (exact ties, decided by load and
// rotation), engine reports with slot waits, learned rates that differ per endpoint,
// lower tiers, fair share on and off.
func TestCostPrunedMatchesFullScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1024))
	for round := 0; round < 400; round++ {
		n := 1 + rng.IntN(64)
		if round%4 == 0 {
			n = 1024
		}
		pinned := 0.0
		if rng.IntN(3) == 0 {
			pinned = 5000 + float64(rng.IntN(10000))
		}
		q := NewQueues(n, pinned, rng.IntN(3)*4, time.Hour)
		loads := balance.NewLoads(n)
		c := &Cost{Loads: loads, Queues: q}
		if rng.IntN(3) > 0 {
			c.FairShare = []float64{DefaultFairShare, 1, 2}[rng.IntN(3)]
			if rng.IntN(2) == 0 {
				c.Popular = NewPopularity(16)
			}
		}
		tokens := 16 * (1 + rng.IntN(1024))
		matched := make([]int32, n)
		holders := rng.IntN(6)
		if rng.IntN(8) == 0 {
			holders = rng.IntN(n + 1) // more than selectPruned takes, at times
		}
		for h := 0; h < holders; h++ {
			matched[rng.IntN(n)] = int32(rng.IntN(tokens/16 + 1))
		}
		now := time.Now()
		busy := rng.IntN(2) == 0 // else most endpoints are alike: ties
		for i := 0; i < n; i++ {
			for k := rng.IntN(3); k > 0; k-- { // in flight: what breaks ties
				loads.Inc(i)
			}
			if busy || rng.IntN(16) == 0 {
				q.Sent(i, rng.IntN(4000))
				q.Finished(i, Ticket{}, time.Duration(rng.IntN(500))*time.Millisecond, 0, false)
				if rng.IntN(2) == 0 {
					q.Observe(i, Report{Running: int64(rng.IntN(12)), Waiting: int64(rng.IntN(3)), Slots: int64(rng.IntN(2) * 8)}, loads.Get(i), now)
				}
			}
			if pinned == 0 && rng.IntN(8) == 0 { // a learned line of its own
				learnLine(q, i, 2000+float64(rng.IntN(20000)), float64(rng.IntN(3))*0.02*rng.Float64())
			}
		}
		cd := candidates(n, matched, tokens)
		cd.MinBlocks = int32(1 + rng.IntN(3))
		for i := 0; i < n; i++ {
			if rng.IntN(4) == 0 {
				cd.Eligible.Clear(i)
			}
		}
		cd.Blocks = chain(uint64(round), tokens/16, 256, 2)
		if c.Popular != nil {
			c.Popular.Record(cd.Blocks, now)
		}
		if rng.IntN(4) == 0 {
			cd.CPU, cd.Storage = make([]int32, n), make([]int32, n)
			cd.CPUCost, cd.StorageCost = 0.06, 0.25
			for i := range matched {
				cd.CPU[i] = matched[i] / 2
				cd.Storage[i] = matched[i] / 4
			}
		}
		for turn := uint64(0); turn < 16; turn++ {
			want := c.selectAt(cd, nil, turn, now, true)
			if got := c.selectAt(cd, nil, turn, now, false); got != want {
				t.Fatalf("round %d (n %d, %d holders, fair share %v) turn %d: pruned scan %d, full scan %d",
					round, n, holders, c.FairShare, turn, got, want)
			}
			if turn >= 4 {
				continue
			}
			if got := c.selectAt(cd, recorder{}, turn, now, true); got != want {
				t.Fatalf("round %d turn %d: observed scan %d, full scan %d", round, turn, got, want)
			}
		}
		// The fleet changes under the policy: lines learned faster or slower (the bound on
		// every floor, Queues.FloorAll, must follow each), endpoints replaced, queues
		// moving. The pruned scan must still decide as the full one after each change.
		for step := 0; step < 6; step++ {
			for k := 1 + rng.IntN(4); k > 0; k-- {
				i := rng.IntN(n)
				switch rng.IntN(6) {
				case 0: // a line far faster than the rest
					learnLine(q, i, 30000+float64(rng.IntN(200000)), 0)
				case 5: // seconds of base everywhere, then one endpoint without
					for e := n - 1; e >= 0; e-- { // downward: the least base moves once
						q.setLine(e, loadF(&q.eps[e].rate), 1+2*rng.Float64())
					}
					q.setLine(i, loadF(&q.eps[i].rate), 0)
				case 1:
					learnLine(q, i, 500+float64(rng.IntN(5000)), 0.05*rng.Float64())
				case 2:
					q.Reset(i)
				case 3:
					q.setLine(i, 100+float64(rng.IntN(1e6)), 0.1*rng.Float64())
				default:
					q.Sent(i, rng.IntN(8000))
				}
			}
			for turn := uint64(0); turn < 2; turn++ {
				want := c.selectAt(cd, nil, turn, now, true)
				if got := c.selectAt(cd, nil, turn, now, false); got != want {
					t.Fatalf("round %d (n %d) step %d turn %d: pruned scan %d, full scan %d",
						round, n, step, turn, got, want)
				}
			}
		}
	}
}

// learnLine teaches endpoint i the prefill line ttft = base + uncached/rate through the
// rate fit (six samples, each alone at the endpoint), as first tokens would.
func learnLine(q *Queues, i int, rate, base float64) {
	for k := 0; k < 6; k++ {
		u := 256 * (k + 1)
		tk := q.Sent(i, u)
		q.FirstToken(i, u, time.Duration((base+float64(u)/rate)*float64(time.Second)), tk)
	}
}

// TestFloorAllFollowsEveryLine: after every change of any endpoint's line (rates learned
// faster and slower, bases lower and higher, endpoints reset, pinned fleets too), the
// fleet's least line is exactly the least base and the highest rate there are, and its
// floor is at most every endpoint's own.
func TestFloorAllFollowsEveryLine(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 80))
	for _, n := range []int{1, 3, 64, 1024} {
		q := NewQueues(n, 0, 0, time.Hour)
		for op := 0; op < 3000; op++ {
			i := rng.IntN(n)
			switch rng.IntN(6) {
			case 0:
				q.Reset(i)
			case 1:
				learnLine(q, i, 100+float64(rng.IntN(50000)), 0.05*rng.Float64())
			default:
				// The extremes' own endpoints move most often: the bound must tighten.
				if rng.IntN(2) == 0 {
					i = q.topAt
				}
				q.setLine(i, 100+float64(rng.IntN(1e6)), []float64{0, 0.001, 0.3}[rng.IntN(3)]*rng.Float64())
			}
			top, low := 0.0, math.Inf(1)
			for e := range q.eps {
				top, low = max(top, loadF(&q.eps[e].rate)), min(low, loadF(&q.eps[e].base))
			}
			if got := loadF(&q.topRate); got != top {
				t.Fatalf("n %d op %d: least line's rate %v, the fleet's highest %v", n, op, got, top)
			}
			if got := loadF(&q.lowBase); got != low {
				t.Fatalf("n %d op %d: least line's base %v, the fleet's least %v", n, op, got, low)
			}
			tokens := rng.IntN(1 << 17)
			for e := 0; e < n; e++ {
				if all, own := q.FloorAll(tokens), q.Floor(e, tokens); all > own {
					t.Fatalf("n %d op %d: FloorAll(%d) %v above endpoint %d's floor %v", n, op, tokens, all, e, own)
				}
			}
		}
	}
	pinned := NewQueues(16, 2500, 0, time.Hour)
	if got, want := pinned.FloorAll(5000), pinned.Floor(3, 5000); got != want {
		t.Fatalf("pinned fleet: FloorAll %v, every endpoint's floor %v", got, want)
	}
}
