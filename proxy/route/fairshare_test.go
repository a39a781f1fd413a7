package route

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/proxy/balance"
)

// chain returns n distinct chained block keys sharing the first shared ones with every
// other chain of the same base.
func chain(base uint64, shared, n int, tail uint64) []uint64 {
	keys := make([]uint64, n)
	for d := range keys {
		keys[d] = base*1_000_003 + uint64(d)
		if d >= shared {
			keys[d] = tail*7_000_001 + uint64(d) + 1<<40
		}
	}
	return keys
}

func TestPopularityCountsRecentPrefixes(t *testing.T) {
	p := NewPopularity(16) // sampled every 8 blocks
	now := time.Now()
	for r := 0; r < 5; r++ {
		p.Record(chain(1, 64, 80, uint64(r)), now)
	}
	p.Record(chain(2, 64, 80, 9), now)
	probe := chain(1, 64, 80, 99)
	if got := p.Count(probe, 64); got != 5 {
		t.Fatalf("shared prefix of 64 blocks: %d followers, want 5", got)
	}
	if got := p.Count(probe, 70); got != 5 {
		t.Fatalf("70 blocks is sampled at block 64: %d, want 5", got)
	}
	if got := p.Count(probe, 80); got != 0 {
		t.Fatalf("the probe's own tail was never sent: %d, want 0", got)
	}
	if got := p.Count(probe, 7); got != 0 {
		t.Fatalf("below one stride nothing is sampled: %d", got)
	}
	// Two rotations later the counts are gone.
	p.Record(nil, now.Add(ShareWindow/2+time.Millisecond))
	if got := p.Count(probe, 64); got != 5 {
		t.Fatalf("one rotation keeps the older generation: %d, want 5", got)
	}
	p.Record(nil, now.Add(ShareWindow+2*time.Millisecond))
	if got := p.Count(probe, 64); got != 0 {
		t.Fatalf("two rotations forget: %d, want 0", got)
	}
}

// fairShareSetup gives endpoint 0 most of the recent prefill work and the request's whole
// 1,024-token prefix (64 blocks, 16 tokens each) cached there, so it is the cheapest by far.
func fairShareSetup(t *testing.T, followers int, fair float64) (*Cost, *Candidates, recorder) {
	t.Helper()
	q := NewQueues(4, 10000, 0, time.Second)
	for i := 0; i < 4; i++ {
		w := 1000
		if i == 0 {
			w = 20000
		}
		tk := q.Sent(i, w)
		q.FirstToken(i, w, time.Millisecond, tk) // the work was done; nothing stays queued
	}
	p := NewPopularity(16)
	now := time.Now()
	for r := 0; r < followers; r++ {
		p.Record(chain(1, 64, 66, uint64(r)), now)
	}
	c := &Cost{Loads: balance.NewLoads(4), Queues: q, Popular: p, FairShare: fair}
	cd := candidates(4, []int32{64, 0, 0, 0}, 64*16+32)
	cd.Blocks = chain(1, 64, 66, 1234)
	return c, cd, recorder{}
}

func TestFairShareMovesAHotPrefixOffAnOverloadedHolder(t *testing.T) {
	// 100 recent followers x 32 uncached tokens each outweigh one 1,024-token copy.
	c, cd, obs := fairShareSetup(t, 100, DefaultFairShare)
	got := c.Select(cd, obs)
	if got == 0 {
		t.Fatalf("the holder is past its share (%.2f of the work, fair %.2f x 1/4) with a hot prefix: must lose the request; terms %+v",
			obs[0].Share, DefaultFairShare, obs)
	}
	if !obs[0].OverShare || obs[got].OverShare || obs[0].Followers != 100 {
		t.Fatalf("terms %+v", obs)
	}
}

func TestFairShareKeepsAPrivatePrefix(t *testing.T) {
	// One recent follower (the conversation's previous turn): moving it costs 1,024 tokens
	// of prefill to balance 32.
	c, cd, obs := fairShareSetup(t, 1, DefaultFairShare)
	if got := c.Select(cd, obs); got != 0 {
		t.Fatalf("a private prefix stays with its holder even past its share: got %d; terms %+v", got, obs)
	}
	if !obs[0].OverShare || obs[0].Followers != 1 {
		t.Fatalf("terms %+v", obs)
	}
}

func TestFairShareOffFollowsTheCache(t *testing.T) {
	c, cd, _ := fairShareSetup(t, 100, 0)
	if got := c.Select(cd, nil); got != 0 {
		t.Fatalf("with the bound off the cheapest (the holder) wins: got %d", got)
	}
}

func TestFairShareNewPromptsAvoidTheBusiest(t *testing.T) {
	c, cd, _ := fairShareSetup(t, 0, DefaultFairShare)
	cd.Matched[0] = 0
	for k := 0; k < 12; k++ {
		if got := c.Select(cd, nil); got == 0 {
			t.Fatal("a prompt nobody holds must not go to the endpoint past its share")
		}
	}
}

func TestFairShareWhenAllArePast(t *testing.T) {
	// Two endpoints with equal work and a bound of exactly the mean: whichever takes the
	// request passes it, so none is within and the cheapest of all (the holder) wins.
	q := NewQueues(2, 10000, 0, time.Second)
	for i := 0; i < 2; i++ {
		tk := q.Sent(i, 5000)
		q.FirstToken(i, 5000, time.Millisecond, tk)
	}
	p := NewPopularity(16)
	for r := 0; r < 100; r++ {
		p.Record(chain(1, 64, 66, uint64(r)), time.Now())
	}
	c := &Cost{Loads: balance.NewLoads(2), Queues: q, Popular: p, FairShare: 1}
	cd := candidates(2, []int32{64, 0}, 64*16+32)
	cd.Blocks = chain(1, 64, 66, 1234)
	obs := recorder{}
	if got := c.Select(cd, obs); got != 0 {
		t.Fatalf("got %d, want the holder; terms %+v", got, obs)
	}
	if !obs[0].OverShare || !obs[1].OverShare {
		t.Fatalf("both must be past the bound: %+v", obs)
	}
}

// Ties rotate evenly over the eligible candidates even when ineligible slots (a fleet's
// vacant ones) sit between them: a start in a run of ineligible slots must not hand its
// turn to the eligible one after the run.
func TestTiesRotateOverEligibleOnly(t *testing.T) {
	q := NewQueues(8, 0, 0, time.Second)
	loads := balance.NewLoads(8)
	c := &Cost{Loads: loads, Queues: q}
	cd := candidates(8, make([]int32, 8), 512)
	for i := 4; i < 8; i++ {
		cd.Eligible.Clear(i)
	}
	dec := &Decode{Loads: loads, Queues: q}
	cost, decode := map[int]int{}, map[int]int{}
	for k := 0; k < 40; k++ {
		cost[c.Select(cd, nil)]++
		decode[dec.Select(cd.Eligible)]++
	}
	for i := 0; i < 4; i++ {
		if cost[i] != 10 || decode[i] != 10 {
			t.Fatalf("ties over 4 eligible of 8 slots: cost %v, decode %v; want 10 each", cost, decode)
		}
	}
}
