package route

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/shard"
)

// Queues is kvgate's view of the work waiting at each endpoint: the prefill tokens it sent
// there that have not produced a first token, the endpoint's measured prefill speed, and
// what the engine itself last reported on its /metrics (running and waiting requests, KV
// usage). Request-path reads are atomic loads; writes come from request completions and
// the scraper.
type Queues struct {
	eps []epQueue
	// work is each endpoint's recent prefill work (float64 bits: prefill seconds sent,
	// scaled, see workT0), apart from eps: the cost policy sums every eligible
	// endpoint's on each decision, and in one array that pass reads 8 bytes an endpoint
	// in sequence instead of a cache line each.
	work       []atomic.Uint64
	pinnedRate float64       // tokens/s from -kv-prefill-rate; 0 learns per endpoint
	staleAfter time.Duration // an engine report older than this no longer counts
	slotsFlag  int64         // -kv-engine-slots; 0 learns them from the engine's reports

	// Each endpoint's recent prefill work (work) is kept scaled by
	// e^((t-workT0)/ShareWindow) for the time t it was sent, so that comparing endpoints
	// needs no decay per read: shares are ratios and the common factor cancels.
	workMu sync.Mutex
	workT0 atomic.Int64 // unix nanos the scale counts from

	// The least prefill line of the fleet: no endpoint's base is below lowBase and none's
	// rate is above topRate, at every moment (see setLine), so FloorAll bounds every
	// endpoint's Floor at once. Writers of a rate or base hold lineMu; lowAt and topAt
	// are the endpoints whose values the bounds are, -1 once the bound may be loose.
	lineMu  sync.Mutex
	lowBase atomic.Uint64 // float64 bits
	topRate atomic.Uint64 // float64 bits
	lowAt   int
	topAt   int
}

// ShareWindow is the time constant over which an endpoint's share of the fleet's recent
// prefill work is measured: long against one request (tens of ms to a second), so one
// long prefill does not swing a share, and short enough that a share from before a drain
// or a traffic shift is forgotten within minutes.
const ShareWindow = 60 * time.Second

// PriorRate is the prefill rate an endpoint is assumed to have before kvgate has measured
// it: an 8B-class model on one current datacenter GPU prefills on the order of 10^4
// tokens/s. Every endpoint starts from the same prior, so it only weighs prefill against
// queueing until the first measurements replace it.
const PriorRate = 10000

// fitDecay is the weight each older sample keeps per new one in the prefill-rate fit:
// about the last 50 unqueued requests count, so a rate follows a GPU that slows down
// within a minute of traffic while one outlier moves it by 2%.
const fitDecay = 0.98

// serviceDecay weighs the mean request duration the same way over the last ~10 requests:
// it sets how long a batch slot stays taken, which follows the traffic's output lengths.
const serviceDecay = 0.9

type epQueue struct {
	queued atomic.Int64 // uncached prompt tokens sent, no first token yet
	// rate and base in the first line: the cost policy's floors read only these two.
	rate     atomic.Uint64 // float64 bits: prefill tokens/s
	base     atomic.Uint64 // float64 bits: fixed seconds before the first token
	service  atomic.Uint64 // float64 bits: mean seconds a request holds its endpoint
	slots    atomic.Int64  // requests the engine runs at once (learned or pinned); 0 unknown
	running  atomic.Int64  // engine-reported, at engAt
	waiting  atomic.Int64  // engine-reported, at engAt
	kvUsage  atomic.Uint64 // float64 bits, engine-reported KV cache usage 0..1
	engAt    atomic.Int64  // unix nanos of the last good engine report; 0 never
	flightAt atomic.Int64  // kvgate's in-flight count when that report was read
	samples  atomic.Int64  // rate-fit samples taken
	sends    atomic.Uint64 // requests sent so far
	prefills atomic.Int64  // requests sent that have not produced a first token

	mu  sync.Mutex // the fit's sums
	fit lineFit
	_   [40]byte // to three whole cache lines
}

// NewQueues returns the view for n endpoints. rate pins every endpoint's prefill rate
// (tokens/s) when > 0; slots pins the engines' concurrent-request capacity when > 0.
// Engine reports older than staleAfter decay to kvgate's own accounting.
func NewQueues(n int, rate float64, slots int, staleAfter time.Duration) *Queues {
	q := &Queues{eps: make([]epQueue, n), work: make([]atomic.Uint64, n), pinnedRate: rate, staleAfter: staleAfter, slotsFlag: int64(slots)}
	q.workT0.Store(time.Now().UnixNano())
	r := float64(PriorRate)
	if rate > 0 {
		r = rate
	}
	for i := range q.eps {
		q.eps[i].rate.Store(math.Float64bits(r))
		q.eps[i].slots.Store(int64(slots))
	}
	storeF(&q.topRate, r)
	storeF(&q.lowBase, 0)
	q.topAt, q.lowAt = -1, -1
	if n > 0 {
		q.topAt, q.lowAt = 0, 0
	}
	return q
}

// Reset forgets everything learned of slot ep (a new endpoint takes it): the prior or
// pinned rate, no queue, no engine report. The fleet calls it on a vacant slot only.
func (q *Queues) Reset(ep int) {
	e := &q.eps[ep]
	r := float64(PriorRate)
	if q.pinnedRate > 0 {
		r = q.pinnedRate
	}
	e.mu.Lock()
	e.fit = lineFit{}
	e.mu.Unlock()
	q.setLine(ep, r, 0)
	storeF(&e.service, 0)
	storeF(&e.kvUsage, 0)
	e.slots.Store(q.slotsFlag)
	for _, a := range [...]*atomic.Int64{&e.queued, &e.running, &e.waiting, &e.engAt, &e.flightAt, &e.samples, &e.prefills} {
		a.Store(0)
	}
	e.sends.Store(0)
}

// Len is the number of endpoints.
func (q *Queues) Len() int { return len(q.eps) }

func loadF(a *atomic.Uint64) float64     { return math.Float64frombits(a.Load()) }
func storeF(a *atomic.Uint64, v float64) { a.Store(math.Float64bits(v)) }

// Ticket is what Sent hands back for FirstToken: whether nothing of kvgate's was queued
// ahead of the request, and which send it was.
type Ticket struct {
	alone   bool
	whole   bool // a non-streamed answer: its first byte comes after its last token
	send    uint64
	prefill float64 // seconds its own prefill takes at the endpoint's rate, queue aside
}

// NoSample marks a first byte that says nothing of the prefill's speed (a whole,
// non-streamed answer comes after the last token).
func (t *Ticket) NoSample() { t.alone, t.whole = false, true }

// Sent records a request dispatched to ep that must prefill uncached tokens.
func (q *Queues) Sent(ep, uncached int) Ticket {
	e := &q.eps[ep]
	alone := e.queued.Add(int64(uncached)) == int64(uncached)
	e.prefills.Add(1)
	rate := loadF(&e.rate)
	q.addWork(ep, float64(uncached)/rate)
	return Ticket{alone: alone, send: e.sends.Add(1), prefill: loadF(&e.base) + float64(uncached)/rate}
}

// WorkScale is the factor that work sent at now carries in the endpoints' scaled work.
func (q *Queues) WorkScale(now time.Time) float64 {
	return math.Exp(float64(now.UnixNano()-q.workT0.Load()) / float64(ShareWindow))
}

// Work is ep's recent prefill work, scaled like every endpoint's (only ratios mean
// anything).
func (q *Queues) Work(ep int) float64 { return loadF(&q.work[ep]) }

// TotalWork is the recent work of the endpoints el holds below n, summed in endpoint
// order (so the same state always gives the same float total). Why its own loop: on a
// fleet it runs over every endpoint on a decision, and the floats' one serial chain of
// adds is all it should wait for, so the loop keeps the sum and the array in registers
// (a sum through memory adds a store-to-load round trip to every add) and takes whole
// words of the mask without their bits.
func (q *Queues) TotalWork(el shard.Mask, n int) float64 {
	work := q.work[:min(n, len(q.work))]
	total := 0.0
	for w, word := range el {
		lo := w << 6
		if lo >= len(work) {
			break
		}
		if word == ^uint64(0) && lo+64 <= len(work) {
			for i := range work[lo : lo+64] {
				total += loadF(&work[lo+i])
			}
			continue
		}
		for ; word != 0; word &= word - 1 {
			i := lo | bits.TrailingZeros64(word)
			if i >= len(work) {
				break
			}
			total += loadF(&work[i])
		}
	}
	return total
}

// addWork counts sec seconds of prefill compute sent to ep now. When the scale grows large
// every endpoint's work is rescaled to a new origin (every ~hour and a half), under workMu
// so no add is lost; a reader in that instant may compare two scales once, harmlessly.
func (q *Queues) addWork(ep int, sec float64) {
	q.workMu.Lock()
	now := time.Now()
	scale := q.WorkScale(now)
	if scale > 1e40 {
		for i := range q.work {
			storeF(&q.work[i], loadF(&q.work[i])/scale)
		}
		q.workT0.Store(now.UnixNano())
		scale = 1
	}
	storeF(&q.work[ep], loadF(&q.work[ep])+sec*scale)
	q.workMu.Unlock()
}

// FirstToken records the first response byte of a request Sent to ep, ttft after it was
// sent. A request that had the endpoint to itself, with nothing of kvgate's queued ahead,
// nothing sent after it before its first token (another prefill would share the GPU) and
// no engine-reported queue, is a sample of the endpoint's prefill line
// ttft = base + uncached/rate.
func (q *Queues) FirstToken(ep, uncached int, ttft time.Duration, t Ticket) {
	e := &q.eps[ep]
	e.queued.Add(-int64(uncached))
	e.prefills.Add(-1)
	if !t.alone || e.sends.Load() != t.send || q.pinnedRate > 0 || ttft <= 0 {
		return
	}
	if q.fresh(e, time.Now()) && e.waiting.Load() > 0 {
		return // it may have waited for a batch slot: not a prefill sample
	}
	e.mu.Lock()
	rate, base, ok := e.fit.add(float64(uncached), ttft.Seconds())
	e.mu.Unlock()
	e.samples.Add(1)
	if ok {
		q.setLine(ep, rate, base)
	}
}

// setLine stores ep's prefill line (rate tokens/s, base seconds) and keeps the fleet's
// least line (lowBase, topRate) below every endpoint's at every moment: a bound the
// new values pass is moved before they are stored, so a reader that sees them sees the
// bound too; a bound that only loosens (its endpoint got slower) is made tight again
// after them, from every endpoint's values (O(endpoints), and only when the endpoint
// holding the bound changes; a loose bound is still a bound meanwhile).
func (q *Queues) setLine(ep int, rate, base float64) {
	e := &q.eps[ep]
	q.lineMu.Lock()
	defer q.lineMu.Unlock()
	if rate >= loadF(&q.topRate) {
		storeF(&q.topRate, rate)
		q.topAt = ep
	}
	if base <= loadF(&q.lowBase) {
		storeF(&q.lowBase, base)
		q.lowAt = ep
	}
	storeF(&e.rate, rate)
	storeF(&e.base, base)
	if (q.topAt == ep && rate < loadF(&q.topRate)) || (q.lowAt == ep && base > loadF(&q.lowBase)) {
		q.tightenLine()
	}
}

// tightenLine sets the least line to the endpoints' own extremes. lineMu held.
func (q *Queues) tightenLine() {
	top, low := math.Inf(-1), math.Inf(1)
	for i := range q.eps {
		if r := loadF(&q.eps[i].rate); r > top {
			top, q.topAt = r, i
		}
		if b := loadF(&q.eps[i].base); b < low {
			low, q.lowAt = b, i
		}
	}
	storeF(&q.topRate, top)
	storeF(&q.lowBase, low)
}

// Unsent takes back a request Sent to ep that ended without a first byte.
func (q *Queues) Unsent(ep, uncached int) {
	q.eps[ep].queued.Add(-int64(uncached))
	q.eps[ep].prefills.Add(-1)
}

// Finished records how long a request held a batch slot at ep: its own prefill plus the
// time from its first byte to its last, for a streamed answer; for a whole answer (or one
// that never produced a byte) the time from sending to the end, the only measure there is.
// Not sent-to-end for streams: under load that includes the wait for the slot, and a
// slot-wait estimate built on it would feed on itself.
func (q *Queues) Finished(ep int, t Ticket, sinceSent, sinceFirst time.Duration, gotFirst bool) {
	e := &q.eps[ep]
	s := sinceSent.Seconds()
	if gotFirst && !t.whole {
		s = t.prefill + sinceFirst.Seconds()
	}
	for {
		old := e.service.Load()
		v := math.Float64frombits(old)
		nv := s
		if v > 0 {
			nv = serviceDecay*v + (1-serviceDecay)*s
		}
		if e.service.CompareAndSwap(old, math.Float64bits(nv)) {
			return
		}
	}
}

// Report is one engine /metrics reading.
type Report struct {
	Running, Waiting int64
	KVUsage          float64 // 0..1; negative when the engine does not say
	Slots            int64   // requests the engine says it runs at once (TensorRT-LLM); 0 unknown
}

// Observe stores an engine report read at now, with kvgate's in-flight count for ep at
// that moment (requests kvgate sends or finishes afterwards correct the report until the
// next one). A report that shows requests waiting tells how many the engine runs at once.
func (q *Queues) Observe(ep int, r Report, inflight int64, now time.Time) {
	e := &q.eps[ep]
	e.running.Store(r.Running)
	e.waiting.Store(r.Waiting)
	storeF(&e.kvUsage, r.KVUsage)
	e.flightAt.Store(inflight)
	e.engAt.Store(now.UnixNano())
	// Requests waiting while r.Running run: that is what the engine runs at once now
	// (its max_num_seqs or what its KV cache holds). More running than that later raises it.
	if q.slotsFlag == 0 && r.Slots > 0 {
		e.slots.Store(r.Slots)
	} else if q.slotsFlag == 0 && r.Running > 0 {
		if s := e.slots.Load(); r.Waiting > 0 || (s > 0 && r.Running > s) {
			e.slots.Store(r.Running)
		}
	}
}

func (q *Queues) fresh(e *epQueue, now time.Time) bool {
	at := e.engAt.Load()
	return at != 0 && now.UnixNano()-at <= int64(q.staleAfter)
}

// Fresh says whether ep's last engine report still counts at now.
func (q *Queues) Fresh(ep int, now time.Time) bool { return q.fresh(&q.eps[ep], now) }

// Ahead is how many requests a new one would wait behind for a batch slot at ep, and
// whether that comes from a fresh engine report: the engine's running and waiting count
// corrected by what kvgate sent or finished since, against the engine's slots; without a
// fresh report, kvgate's own in-flight count against the slots.
func (q *Queues) Ahead(ep int, inflight int64, now time.Time) (ahead int64, fromEngine bool) {
	e := &q.eps[ep]
	occ := inflight
	if q.fresh(e, now) {
		occ = e.running.Load() + e.waiting.Load() + inflight - e.flightAt.Load()
		fromEngine = true
	}
	slots := e.slots.Load()
	if slots <= 0 || occ < slots {
		return 0, fromEngine
	}
	return occ - slots + 1, fromEngine
}

// Predict is the time to first token at ep for a request of uncached tokens, and the
// cost of sending it there.
//
// An engine shares its prefill compute among the prompts it is prefilling (a GPU step
// batches every scheduled prompt's tokens; vLLM's chunked prefill and SGLang's mixed
// batches both do), so prefill is processor-shared: with n requests still before their
// first token and Q uncached tokens among them, a new request of u tokens is done once
// u plus, from each of the others, as much as u of its own has been processed: at most
// min(Q, n x u) more. A cached follow-up (u small) barely waits behind a long prefill; a
// full prefill (u large) waits for the whole queue. Then comes any wait for a batch slot
// (each request ahead frees one of the slots after a mean slot time / slots).
//
// The same sharing is what the request's prefill does to the others: each of the n is
// delayed by as much as u of its remaining work, min(Q, n x u) in all. Cost adds that
// delay to the request's own time: the first-token time the whole pool loses by the
// choice, which is what placing one request should minimize.
//
// It fills t's queue and prediction fields in place: the cost policy's loop over a fleet
// reuses one Terms rather than copy one out per candidate (at 1,024 endpoints the copies
// were half of Select).
func (q *Queues) Predict(t *Terms, ep, uncached int, inflight int64, now time.Time) {
	e := &q.eps[ep]
	queued := max(e.queued.Load(), 0)
	waiting := max(e.prefills.Load(), 0)
	rate := loadF(&e.rate)
	t.Uncached, t.Queued, t.Waiting, t.InFlight, t.Rate, t.Source = uncached, queued, waiting, inflight, rate, "kvgate"
	ahead, eng := q.Ahead(ep, inflight, now)
	if eng {
		t.Source = "engine"
	}
	t.Ahead = ahead
	shared := float64(min(queued, waiting*int64(uncached)))
	sec := loadF(&e.base) + (float64(uncached)+shared)/rate
	if ahead > 0 {
		if slots := e.slots.Load(); slots > 0 {
			sec += float64(ahead) * loadF(&e.service) / float64(slots)
		}
	}
	t.Predicted = sec * 1000
	t.Delays = shared / rate * 1000
	t.Cost = t.Predicted + t.Delays
}

// Floor is a lower bound on Predict's Cost for a request of uncached tokens at ep: the
// prefill alone, computed with Predict's own operations on the same values, so that with
// every term Predict adds (shared work, the slot wait, the delay to others) >= 0, float
// rounding keeps Cost >= Floor.
func (q *Queues) Floor(ep, uncached int) float64 {
	e := &q.eps[ep]
	return (loadF(&e.base) + float64(uncached)/loadF(&e.rate)) * 1000
}

// FloorAll is a lower bound on Floor(ep, uncached) for every endpoint ep at once: the
// prefill alone on the fleet's least line, the least base and the highest rate, which
// no endpoint's own line passes below (setLine). Exact in floats too, with no margin:
// each operation of Floor's formula is correctly rounded and so monotone in its
// operands (a smaller base, a larger rate give a result no larger), so the bound's
// result is <= every endpoint's Floor as Floor computes it.
func (q *Queues) FloorAll(uncached int) float64 {
	return (loadF(&q.lowBase) + float64(uncached)/loadF(&q.topRate)) * 1000
}

// EndpointView is one endpoint's learned and reported state, for /debug/inventory.
type EndpointView struct {
	QueuedTokens int64   `json:"queued_prefill_tokens"`
	Rate         float64 `json:"prefill_tokens_per_s"`
	BaseMs       float64 `json:"prefill_base_ms"`
	ServiceMs    float64 `json:"mean_request_ms"`
	Slots        int64   `json:"slots"`
	RateSamples  int64   `json:"rate_samples"`
	Engine       struct {
		Fresh   bool    `json:"fresh"`
		AgeMs   float64 `json:"age_ms"`
		Running int64   `json:"running"`
		Waiting int64   `json:"waiting"`
		KVUsage float64 `json:"kv_usage"`
	} `json:"engine_report"`
}

// View reads ep's state.
func (q *Queues) View(ep int, now time.Time) EndpointView {
	e := &q.eps[ep]
	var v EndpointView
	v.QueuedTokens = e.queued.Load()
	v.Rate = loadF(&e.rate)
	v.BaseMs = loadF(&e.base) * 1000
	v.ServiceMs = loadF(&e.service) * 1000
	v.Slots = e.slots.Load()
	v.RateSamples = e.samples.Load()
	if at := e.engAt.Load(); at != 0 {
		v.Engine.Fresh = q.fresh(e, now)
		v.Engine.AgeMs = float64(now.UnixNano()-at) / 1e6
		v.Engine.Running, v.Engine.Waiting = e.running.Load(), e.waiting.Load()
		v.Engine.KVUsage = loadF(&e.kvUsage)
	}
	return v
}

// KVUsage is ep's engine-reported KV usage and whether the report is fresh.
func (q *Queues) KVUsage(ep int, now time.Time) (float64, bool) {
	e := &q.eps[ep]
	return loadF(&e.kvUsage), q.fresh(e, now)
}

// Running is ep's engine-reported running plus waiting requests corrected by kvgate's
// dispatches since the report, and whether the report is fresh.
func (q *Queues) Running(ep int, inflight int64, now time.Time) (int64, bool) {
	e := &q.eps[ep]
	if !q.fresh(e, now) {
		return inflight, false
	}
	return max(e.running.Load()+e.waiting.Load()+inflight-e.flightAt.Load(), 0), true
}

// lineFit is an exponentially weighted least-squares fit of y = a + b x, for the prefill
// line ttft = base + uncached/rate.
type lineFit struct{ w, x, y, xx, xy float64 }

// add takes one sample and returns the fitted rate (1/b) and base (a), ok when the
// samples spread enough in x to tell slope from intercept and the fit is physical.
func (f *lineFit) add(x, y float64) (rate, base float64, ok bool) {
	f.w = fitDecay*f.w + 1
	f.x = fitDecay*f.x + x
	f.y = fitDecay*f.y + y
	f.xx = fitDecay*f.xx + x*x
	f.xy = fitDecay*f.xy + x*y
	if f.w < 4 {
		return 0, 0, false
	}
	mx, my := f.x/f.w, f.y/f.w
	vx := f.xx/f.w - mx*mx
	// Below a spread of a few blocks' worth of tokens the slope is noise.
	if vx < 64*64 {
		return 0, 0, false
	}
	b := (f.xy/f.w - mx*my) / vx
	if b <= 0 || math.IsNaN(b) {
		return 0, 0, false
	}
	a := my - b*mx
	rate = 1 / b
	if rate < 100 || rate > 1e8 {
		return 0, 0, false
	}
	return rate, max(a, 0), true
}
