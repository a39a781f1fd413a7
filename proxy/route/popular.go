package route

import (
	"sync"
	"sync/atomic"
	"time"
)

// Popularity estimates how many of the recent requests carried a given prompt prefix, so
// the cost policy can tell a shared prefix whose followers bring more work than a second
// copy of it costs (worth a second holder once its holder does more than its share) from
// a private one such as a conversation's history (which only its own next turn reuses:
// moving it wastes its whole prefill for nobody).
//
// It is a one-row count sketch over the prompts' chained block keys, sampled every
// popStride tokens: a chained key names the whole prefix up to its block. Two generations
// of half a ShareWindow each make the counts recent. A collision can only add counts; at
// the counts that matter (a prefix's followers outweighing its length) a stray count or
// two changes nothing.
type Popularity struct {
	stride int // blocks between sampled keys
	gens   [2]popGen
	cur    atomic.Uint32
	next   atomic.Int64 // unix nanos of the next rotation
	mu     sync.Mutex   // one rotation at a time
}

// popTokens is the sampling stride in tokens: a request whose private part is shorter
// than this may be taken for its shared prefix, which costs at most this much prefill.
const popTokens = 128

const popSlots = 1 << 16

type popGen struct {
	counts [popSlots]atomic.Uint32
	total  atomic.Int64
}

// NewPopularity returns a sketch for prompts cut into blocks of blockSize tokens.
func NewPopularity(blockSize int) *Popularity {
	p := &Popularity{stride: max(1, popTokens/max(blockSize, 1))}
	p.next.Store(time.Now().Add(ShareWindow / 2).UnixNano())
	return p
}

func popSlot(k uint64) uint32 { return uint32((k * 0x9e3779b97f4a7c15) >> 48) }

// Record counts one request whose prompt has the chained block keys keys.
func (p *Popularity) Record(keys []uint64, now time.Time) {
	if now.UnixNano() >= p.next.Load() {
		p.rotate(now)
	}
	g := &p.gens[p.cur.Load()]
	for d := p.stride - 1; d < len(keys); d += p.stride {
		g.counts[popSlot(keys[d])].Add(1)
	}
	g.total.Add(1)
}

// rotate starts a new generation, forgetting the older of the two.
func (p *Popularity) rotate(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.UnixNano() < p.next.Load() {
		return
	}
	old := 1 - p.cur.Load()
	g := &p.gens[old]
	for i := range g.counts {
		g.counts[i].Store(0)
	}
	g.total.Store(0)
	p.cur.Store(old)
	p.next.Store(now.Add(ShareWindow / 2).UnixNano())
}

// Count is how many recent requests carried the prefix of the first blocks blocks of
// keys (at the sampling stride: the deepest sampled block within it).
func (p *Popularity) Count(keys []uint64, blocks int) int64 {
	d := blocks/p.stride*p.stride - 1
	if d < 0 || d >= len(keys) {
		return 0
	}
	s := popSlot(keys[d])
	var n int64
	for i := range p.gens {
		n += int64(p.gens[i].counts[s].Load())
	}
	return n
}
