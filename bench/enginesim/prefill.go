package enginesim

import (
	"container/heap"
	"context"
	"math"
	"sync"
	"time"
)

// sharedPrefill is one engine's prefill compute, processor-shared: it does one unit of
// prefill work (PrefillPerToken x uncached tokens, measured at full rate) per unit of time
// in total, split equally among the requests prefilling now. With n requests in prefill
// each advances at 1/n, so the engine's prefill throughput does not grow with its batch,
// as on a GPU whose prefill is compute-bound.
//
// It runs on virtual time: v is the work every active request has received since the
// compute started, dv/dt = 1/n. A request that joins at v0 needing w finishes when v
// reaches v0+w (its tag), so finishing order is tag order and only the set changing
// moves the next finish. One timer is armed for the smallest tag; joins, leaves and
// finishes re-arm it. Nothing polls.
type sharedPrefill struct {
	mu    sync.Mutex
	v     float64   // virtual work done per active request, in nanoseconds of full-rate compute
	last  time.Time // when v was last advanced
	jobs  prefillHeap
	timer *time.Timer
	now   func() time.Time
}

type prefillJob struct {
	tag  float64 // v at which the job's work is done
	idx  int     // heap index; -1 once finished or removed
	done chan struct{}
}

// finishSlack is how close (ns of virtual work) v must come to a tag to finish it: float
// rounding must not leave a job waiting on a timer of a few nanoseconds.
const finishSlack = 100

func newSharedPrefill() *sharedPrefill {
	p := &sharedPrefill{now: time.Now}
	p.timer = time.AfterFunc(time.Hour, p.fire)
	p.timer.Stop()
	return p
}

// run blocks until work of full-rate prefill has been done for this request, sharing the
// compute with the others in prefill. false: ctx ended first (the request leaves the
// compute and its share goes to the others).
func (p *sharedPrefill) run(ctx context.Context, work time.Duration) bool {
	if work <= 0 {
		return ctx.Err() == nil
	}
	j := &prefillJob{done: make(chan struct{})}
	p.mu.Lock()
	p.advanceLocked()
	j.tag = p.v + float64(work)
	heap.Push(&p.jobs, j)
	p.rearmLocked()
	p.mu.Unlock()
	select {
	case <-j.done:
		return true
	case <-ctx.Done():
		p.mu.Lock()
		p.advanceLocked()
		if j.idx >= 0 {
			heap.Remove(&p.jobs, j.idx)
		}
		p.rearmLocked()
		p.mu.Unlock()
		return false
	}
}

// active is the number of requests in the shared compute now.
func (p *sharedPrefill) active() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.jobs)
}

func (p *sharedPrefill) fire() {
	p.mu.Lock()
	p.advanceLocked()
	p.rearmLocked()
	p.mu.Unlock()
}

// advanceLocked brings v to now: the time since the last change was split among the jobs
// active during it.
func (p *sharedPrefill) advanceLocked() {
	now := p.now()
	if n := len(p.jobs); n > 0 {
		p.v += float64(now.Sub(p.last)) / float64(n)
	}
	p.last = now
}

// rearmLocked finishes every job whose work is done and arms the timer for the next one.
func (p *sharedPrefill) rearmLocked() {
	for len(p.jobs) > 0 && p.jobs[0].tag-p.v <= finishSlack {
		j := heap.Pop(&p.jobs).(*prefillJob)
		close(j.done)
	}
	if len(p.jobs) == 0 {
		p.timer.Stop()
		p.v = 0 // idle: restart the virtual clock so tags keep full float precision
		return
	}
	// The head finishes after (tag - v) of its own work, at 1/n of the compute each.
	d := (p.jobs[0].tag - p.v) * float64(len(p.jobs))
	p.timer.Reset(time.Duration(math.Ceil(d)))
}

// prefillHeap orders jobs by tag.
type prefillHeap []*prefillJob

func (h prefillHeap) Len() int           { return len(h) }
func (h prefillHeap) Less(i, j int) bool { return h[i].tag < h[j].tag }
func (h prefillHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *prefillHeap) Push(x any) {
	j := x.(*prefillJob)
	j.idx = len(*h)
	*h = append(*h, j)
}
func (h *prefillHeap) Pop() any {
	old := *h
	j := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	j.idx = -1
	return j
}
