package bench

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
	"github.com/kvgate/kvgate/hashcore"
)

// latencyModel is the simulator's latency model (enginesim's scheduler and serveGenerate):
// an engine admits requests first come first served, at most MaxBatch at once and only
// when its KV pool has the request's new blocks free (the queue's head blocks the rest);
// an admitted request prefills its uncached tokens in PrefillBase + uncached x
// PrefillPerToken, streams its first token, then one more every DecodePerToken, and holds
// its slot and blocks until its last token. With SharedPrefill the per-token part of
// prefill is processor shared: the requests prefilling at once split the engine's prefill
// rate equally (PrefillBase stays per request).
type latencyModel struct {
	MaxBatch, BlockSize                          int
	PrefillBase, PrefillPerToken, DecodePerToken time.Duration
	SharedPrefill                                bool
}

func modelOf(c enginesim.Config) latencyModel {
	return latencyModel{MaxBatch: max(c.MaxBatch, 1), BlockSize: max(c.Chain.BlockSize(), 1), PrefillBase: c.PrefillBase,
		PrefillPerToken: c.PrefillPerToken, DecodePerToken: c.DecodePerToken, SharedPrefill: c.PrefillShared}
}

// inFlight is an admitted request as the admission model sees it: when (from now) it
// releases its slot and how many pool blocks it gives back then.
type inFlight struct {
	release time.Duration
	blocks  int
}

// waiting is a request queued ahead: the blocks it takes at admission and how long it
// then holds them and its slot.
type waiting struct {
	blocks  int
	service time.Duration
}

// admitWait is how long a request needing blocks new pool blocks waits to be admitted, by
// running the engine's FCFS admission forward from now: free blocks are allocatable now;
// running requests release their slot and blocks at their release; the queue ahead is
// admitted in order, each when a slot and its blocks are free, and then runs for its
// service time. A request that can never fit (more blocks than the pool frees) waits
// until the last release. queueAdmits, when not nil, receives each queued request's
// admission time.
func admitWait(maxBatch, free int, running []inFlight, queue []waiting, blocks int, queueAdmits []time.Duration) time.Duration {
	run := slices.Clone(running)
	now := time.Duration(0)
	admit := func(need int) time.Duration {
		for {
			if len(run) < max(maxBatch, 1) && need <= free {
				return now
			}
			if len(run) == 0 {
				return now // nothing left to free: the engine takes it as soon as it can
			}
			// Advance to the next release.
			k := 0
			for j := range run {
				if run[j].release < run[k].release {
					k = j
				}
			}
			now = max(now, run[k].release)
			free += run[k].blocks
			run = slices.Delete(run, k, k+1)
		}
	}
	for i, q := range queue {
		at := admit(q.blocks)
		if i < len(queueAdmits) {
			queueAdmits[i] = at
		}
		free -= q.blocks
		run = append(run, inFlight{release: at + q.service, blocks: q.blocks})
	}
	return admit(blocks)
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

// predictTTFT is the simulator's time to first token for a request placed on an engine
// now, and the admission wait within it: the engine's FCFS admission (see admitWait) of a
// request needing blocks new pool blocks, then the prefill of its uncached tokens beside
// the requests prefilling then (see prefillTime). queueAdmits is as for admitWait.
func predictTTFT(m latencyModel, free int, running []inFlight, queue []waiting, inPrefill []int, blocks, uncached int, queueAdmits []time.Duration) (wait, ttft time.Duration) {
	wait = admitWait(m.MaxBatch, free, running, queue, blocks, queueAdmits)
	return wait, wait + prefillTime(m, uncached, inPrefill)
}

// OraclePolicy places each request where the simulator's own latency model predicts the
// least time to first token (admission wait for a slot and pool blocks, then prefill of
// the uncached tokens), knowing every engine's cache exactly (its pool: Pool().Probe with
// the request's keys, or Sim.ProbeBody), its free blocks and queue length (Stats), and what
// is running there (every request the oracle placed and has not seen finish). Ties go to
// the least loaded engine, then round-robin. It is the ceiling a KV-aware router can reach.
func OraclePolicy() Policy {
	return Policy{Name: "oracle", Start: func(ctx context.Context, env *Env) (Target, func() error, error) {
		return newOracle(env.Sims), func() error { return nil }, nil
	}}
}

// forgetAfter is how long past its predicted release a request whose end the oracle never
// hears of still counts as running.
const forgetAfter = 2 * time.Second

// inTransit is how long after placement a request may not have reached its engine yet.
const inTransit = 2 * time.Millisecond

// placed is a request the oracle sent and has not seen finish.
type placed struct {
	id           uint64
	routed       time.Time
	prefillStart time.Time // admission, as last predicted
	prefillEnd   time.Time
	release      time.Time // when its last token is out and its slot frees
	uncached     int
	blocks       int           // new pool blocks it takes at admission
	prefill      time.Duration // admission to first token
	service      time.Duration // admission to release
}

type oracle struct {
	sims  []*enginesim.Sim
	model []latencyModel

	mu     sync.Mutex
	next   int
	lastID uint64
	open   [][]placed // per engine, in placement order

	// scratch for one decision
	running []inFlight
	queue   []waiting
	queued  []int // indexes into open[i] of the queue, in order
	admits  []time.Duration
	prefill []int
}

func newOracle(sims []*enginesim.Sim) *oracle {
	o := &oracle{sims: sims, open: make([][]placed, len(sims))}
	for _, s := range sims {
		o.model = append(o.model, modelOf(s.Config()))
	}
	return o
}

// oracleRequest is the part of a request body the oracle reads to probe every engine with
// one tokenization: what the harness sends (model, messages or a string prompt, the output
// budget). Anything else makes it ask each engine itself (Sim.ProbeBody).
type oracleRequest struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Tools               json.RawMessage `json:"tools"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
	CacheSalt           json.RawMessage `json:"cache_salt"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
}

// prompt reads the output budget of body and tokenizes and hashes it once for every
// engine, the way enginesim's prepare does for such a body (the engines of one run are
// launched from one Spec: one encoder, one chain). tokens is nil when the body has
// anything that changes tokens or keys per engine (LoRA, cache salt, tools, template
// arguments, P/D parameters) or does not parse: the engines are then asked one by one.
func (o *oracle) prompt(body []byte, chat bool) (tokens []uint32, keys []uint64, maxNew int) {
	c := o.sims[0].Config()
	var r oracleRequest
	err := json.Unmarshal(body, &r)
	maxNew = c.DefaultMaxTokens
	if r.MaxTokens != nil {
		maxNew = *r.MaxTokens
	}
	if r.MaxCompletionTokens != nil {
		maxNew = *r.MaxCompletionTokens
	}
	maxNew = max(maxNew, 1)
	if err != nil || c.Encoder == nil || r.Model != "" && r.Model != c.Model ||
		present(r.Tools) || present(r.ChatTemplateKwargs) || present(r.CacheSalt) || present(r.KVTransferParams) {
		return nil, nil, maxNew
	}
	if chat {
		if !present(r.Messages) {
			return nil, nil, maxNew
		}
		tokens, err = c.Encoder.EncodeChat(nil, &enginesim.ChatPrompt{Messages: r.Messages, AddGenerationPrompt: true})
	} else {
		var str string
		if json.Unmarshal(r.Prompt, &str) != nil {
			return nil, nil, maxNew
		}
		tokens, err = c.Encoder.EncodePrompt(nil, str)
	}
	if err != nil || len(tokens) == 0 {
		return nil, nil, maxNew
	}
	return tokens, hashcore.Keys(c.Chain, nil, tokens, nil), maxNew
}

func present(b json.RawMessage) bool { return len(b) > 0 && string(b) != "null" }

// probe is what the oracle knows of engine i for the request: prompt and cached tokens
// (from its pool), requests running and waiting, and free pool blocks.
func (o *oracle) probe(i int, body []byte, chat bool, tokens []uint32, keys []uint64) (enginesim.Probe, int, error) {
	s := o.sims[i]
	st := s.Stats()
	if tokens == nil {
		pr, err := s.ProbeBody(body, chat)
		return pr, st.FreeBlocks, err
	}
	return enginesim.Probe{PromptTokens: len(tokens), CachedTokens: s.Pool().Probe(keys, len(tokens)), Running: st.Running,
		Waiting: st.Waiting}, st.FreeBlocks, nil
}

// state rebuilds engine i's admission view into the oracle's scratch: the engine says how
// many requests wait in its FCFS queue, and those are the latest of the oracle's requests
// that reached it (plus any still in transit, behind them); the others run. Queued
// requests get their admission re-predicted.
func (o *oracle) state(i int, now time.Time, engineWaiting int) {
	o.open[i] = slices.DeleteFunc(o.open[i], func(p placed) bool { return now.Sub(p.release) > forgetAfter })
	open := o.open[i]
	o.running, o.queue, o.queued, o.prefill = o.running[:0], o.queue[:0], o.queued[:0], o.prefill[:0]
	arrived := len(open)
	for arrived > 0 && now.Sub(open[arrived-1].routed) < inTransit {
		arrived--
	}
	firstQueued := max(arrived-engineWaiting, 0)
	for j := range open {
		p := &open[j]
		if j >= firstQueued {
			o.queued = append(o.queued, j)
			o.queue = append(o.queue, waiting{blocks: p.blocks, service: p.service})
			continue
		}
		if p.prefillStart.After(now) {
			// Predicted to be queued still, but the engine has admitted it: by now at the latest.
			p.prefillStart, p.prefillEnd, p.release = now, now.Add(p.prefill), now.Add(p.service)
		}
		// A request the model says is done but that has not finished (a busy machine
		// runs late) is taken to release its slot now.
		o.running = append(o.running, inFlight{release: max(p.release.Sub(now), 0), blocks: p.blocks})
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
	tokens, keys, maxNew := o.prompt(body, chat) // outside the lock: the slow part
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	n := len(o.sims)
	best, bestLoad := -1, 0
	var bestTTFT time.Duration
	var bestPlaced placed
	for j := 0; j < n; j++ {
		i := (o.next + j) % n
		pr, free, err := o.probe(i, body, chat, tokens, keys)
		if err != nil {
			return "", nil, err
		}
		m := o.model[i]
		o.state(i, now, pr.Waiting)
		o.admits = append(o.admits[:0], make([]time.Duration, len(o.queue))...)
		uncached := pr.PromptTokens - pr.CachedTokens
		blocks := (pr.PromptTokens+maxNew+m.BlockSize-1)/m.BlockSize - pr.CachedTokens/m.BlockSize
		wait, ttft := predictTTFT(m, free, o.running, o.queue, o.prefill, blocks, uncached, o.admits)
		for k, q := range o.queued {
			// Queued requests: what they wait for now is the best guess of their start.
			p := &o.open[i][q]
			p.prefillStart = now.Add(o.admits[k])
			p.prefillEnd = p.prefillStart.Add(p.prefill)
			p.release = p.prefillStart.Add(p.service)
		}
		pf := ttft - wait
		// The engine's own count when it is ahead of ours (requests of an earlier run).
		load := max(len(o.open[i]), pr.Running+pr.Waiting)
		if best < 0 || ttft < bestTTFT || ttft == bestTTFT && load < bestLoad {
			service := pf + time.Duration(maxNew-1)*m.DecodePerToken
			best, bestTTFT, bestLoad = i, ttft, load
			bestPlaced = placed{routed: now, prefillStart: now.Add(wait), prefillEnd: now.Add(ttft), release: now.Add(wait + service),
				uncached: uncached, blocks: blocks, prefill: pf, service: service}
		}
	}
	o.next = (o.next + 1) % n
	if m := o.model[best]; m.SharedPrefill {
		// The newcomer slows every request prefilling beside it by min(its rest, ours).
		start := bestPlaced.prefillStart
		for k := range o.open[best] {
			p := &o.open[best][k]
			if start.Before(p.prefillEnd) && !start.Before(p.prefillStart) {
				left := float64(p.prefillEnd.Sub(start)) / float64(p.prefillEnd.Sub(p.prefillStart))
				d := time.Duration(min(int(float64(p.uncached)*left+0.5), bestPlaced.uncached)) * m.PrefillPerToken
				p.prefillEnd = p.prefillEnd.Add(d)
				p.release = p.release.Add(d)
				p.prefill += d
				p.service += d
			}
		}
	}
	o.lastID++
	bestPlaced.id = o.lastID
	o.open[best] = append(o.open[best], bestPlaced)
	id := bestPlaced.id
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
