package bench

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
)

// latencyModel is the simulator's latency model (enginesim's serveGenerate and scheduler):
// an engine admits requests first come first served, at most MaxBatch at once; an admitted
// request prefills its uncached tokens in PrefillBase + uncached x PrefillPerToken, streams
// its first token, then one more token every DecodePerToken, and holds its batch slot
// until its last token. With SharedPrefill the per-token part of prefill is processor
// shared: the requests prefilling at once split the engine's prefill rate equally (the
// fixed PrefillBase stays per request).
type latencyModel struct {
	MaxBatch                                     int
	PrefillBase, PrefillPerToken, DecodePerToken time.Duration
	SharedPrefill                                bool
}

func modelOf(c enginesim.Config) latencyModel {
	return latencyModel{MaxBatch: max(c.MaxBatch, 1), PrefillBase: c.PrefillBase, PrefillPerToken: c.PrefillPerToken,
		DecodePerToken: c.DecodePerToken}
}

// slotWait is how long a request arriving now waits for a batch slot: with the requests
// ahead of it (running or queued, FCFS) releasing their slots after releases (from now, any
// order), it starts when len(releases)-MaxBatch+1 of them have released theirs.
func slotWait(maxBatch int, releases []time.Duration) time.Duration {
	k := len(releases) - max(maxBatch, 1)
	if k < 0 {
		return 0
	}
	s := slices.Clone(releases)
	slices.Sort(s)
	return max(s[k], 0)
}

// prefillTime is the prefill of uncached tokens starting now. inPrefill are the uncached
// tokens the requests already prefilling still have to do; they matter only with
// SharedPrefill, where (processor sharing, no later arrivals) a request with u tokens
// finishes after u + sum(min(r, u)) tokens' worth of the engine's rate.
func prefillTime(m latencyModel, uncached int, inPrefill []int) time.Duration {
	work := uncached
	if m.SharedPrefill {
		for _, r := range inPrefill {
			work += min(max(r, 0), uncached)
		}
	}
	return m.PrefillBase + time.Duration(work)*m.PrefillPerToken
}

// predictTTFT is the simulator's time to first token for a request placed on an engine now:
// the wait for a batch slot plus the prefill of its uncached tokens.
func predictTTFT(m latencyModel, releases []time.Duration, inPrefill []int, uncached int) time.Duration {
	return slotWait(m.MaxBatch, releases) + prefillTime(m, uncached, inPrefill)
}

// OraclePolicy places each request where the simulator's own latency model predicts the
// least time to first token, knowing every engine's cache exactly (its pool, asked through
// Sim.ProbeBody) and its queue (every request the oracle placed and has not seen finish,
// with the slot-release time the model predicts for it). Ties go to the least loaded
// engine, then round-robin. It is the ceiling a KV-aware router can reach.
func OraclePolicy() Policy {
	return Policy{Name: "oracle", Start: func(ctx context.Context, env *Env) (Target, func() error, error) {
		return newOracle(env.Sims), func() error { return nil }, nil
	}}
}

// forgetAfter is how long past its predicted release a request whose end the oracle never
// hears of still counts as running.
const forgetAfter = 2 * time.Second

// placed is a request the oracle sent and has not seen finish.
type placed struct {
	id           uint64
	prefillStart time.Time // when its prefill starts (after its slot wait)
	prefillEnd   time.Time
	release      time.Time // when its last token is out and its slot frees
	uncached     int
}

type oracle struct {
	sims  []*enginesim.Sim
	model []latencyModel
	urls  map[string]int

	mu     sync.Mutex
	next   int
	lastID uint64
	open   [][]placed // per engine, in placement order
	// scratch for one decision
	releases []time.Duration
	prefill  []int
}

func newOracle(sims []*enginesim.Sim) *oracle {
	o := &oracle{sims: sims, urls: map[string]int{}, open: make([][]placed, len(sims))}
	for i, s := range sims {
		o.model = append(o.model, modelOf(s.Config()))
		o.urls[s.URL()] = i
	}
	return o
}

// maxTokensOf reads the request's output budget (the slot is held while it decodes).
func maxTokensOf(body []byte, def int) int {
	var r struct {
		MaxTokens           *int `json:"max_tokens"`
		MaxCompletionTokens *int `json:"max_completion_tokens"`
	}
	if json.Unmarshal(body, &r) != nil {
		return def
	}
	if r.MaxCompletionTokens != nil {
		return *r.MaxCompletionTokens
	}
	if r.MaxTokens != nil {
		return *r.MaxTokens
	}
	return def
}

// state lists engine i's slot releases (from now) and the uncached tokens still to prefill
// of its requests prefilling now, into the oracle's scratch.
func (o *oracle) state(i int, now time.Time) {
	o.releases, o.prefill = o.releases[:0], o.prefill[:0]
	// Requests placed through Route (no done) are forgotten well after their release.
	o.open[i] = slices.DeleteFunc(o.open[i], func(p placed) bool { return now.Sub(p.release) > forgetAfter })
	for _, p := range o.open[i] {
		// A request the model says is done but that has not finished (a busy machine
		// runs late) is taken to release its slot now.
		o.releases = append(o.releases, max(p.release.Sub(now), 0))
		if !now.Before(p.prefillStart) && now.Before(p.prefillEnd) {
			left := float64(p.prefillEnd.Sub(now)) / float64(p.prefillEnd.Sub(p.prefillStart))
			o.prefill = append(o.prefill, int(float64(p.uncached)*left+0.5))
		}
	}
}

// Route places a request without hearing when it finishes: the model's release time is
// taken as the truth (see RouteTracked).
func (o *oracle) Route(body []byte, chat bool) (string, error) {
	base, _, err := o.RouteTracked(body, chat)
	return base, err
}

// RouteTracked places a request; done frees its slot in the oracle's view of the engine.
func (o *oracle) RouteTracked(body []byte, chat bool) (string, func(), error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	n := len(o.sims)
	best, bestLoad, bestUncached := -1, 0, 0
	var bestTTFT, bestWait time.Duration
	for j := 0; j < n; j++ {
		i := (o.next + j) % n
		pr, err := o.sims[i].ProbeBody(body, chat)
		if err != nil {
			return "", nil, err
		}
		o.state(i, now)
		m := o.model[i]
		uncached := pr.PromptTokens - pr.CachedTokens
		wait := slotWait(m.MaxBatch, o.releases)
		ttft := wait + prefillTime(m, uncached, o.prefill)
		// The engine's own count when it is ahead of ours (requests of an earlier run).
		load := max(len(o.open[i]), pr.Running+pr.Waiting)
		if best < 0 || ttft < bestTTFT || ttft == bestTTFT && load < bestLoad {
			best, bestTTFT, bestWait, bestLoad, bestUncached = i, ttft, wait, load, uncached
		}
	}
	o.next = (o.next + 1) % n
	m := o.model[best]
	maxNew := max(maxTokensOf(body, o.sims[best].Config().DefaultMaxTokens), 1)
	start := now.Add(bestWait)
	pEnd := now.Add(bestTTFT)
	if m.SharedPrefill {
		// The newcomer slows every request prefilling beside it by min(its rest, ours).
		for k := range o.open[best] {
			p := &o.open[best][k]
			if start.Before(p.prefillEnd) && !start.Before(p.prefillStart) {
				left := float64(p.prefillEnd.Sub(start)) / float64(p.prefillEnd.Sub(p.prefillStart))
				d := time.Duration(min(int(float64(p.uncached)*left+0.5), bestUncached)) * m.PrefillPerToken
				p.prefillEnd = p.prefillEnd.Add(d)
				p.release = p.release.Add(d)
			}
		}
	}
	o.lastID++
	id := o.lastID
	o.open[best] = append(o.open[best], placed{id: id, prefillStart: start, prefillEnd: pEnd,
		release: pEnd.Add(time.Duration(maxNew-1) * m.DecodePerToken), uncached: bestUncached})
	return o.sims[best].URL(), func() { o.finish(best, id) }, nil
}

func (o *oracle) finish(i int, id uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.open[i] = slices.DeleteFunc(o.open[i], func(p placed) bool { return p.id == id })
}

// trackedTarget is a Target that wants to know when each request it routed has finished:
// the harness calls done once the response ended (or failed).
type trackedTarget interface {
	RouteTracked(body []byte, chat bool) (base string, done func(), err error)
}
