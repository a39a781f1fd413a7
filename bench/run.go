package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
)

// Config is one TTFT benchmark: the engines, the policies and the workload.
type Config struct {
	Engines  int            // simulated engines per policy run (default 4)
	Sim      enginesim.Spec // template for every engine (Name, Listen and Events are set per engine)
	Policies []Policy
	Workload Workload
	// Kvgate is the kvgate binary; Tokenizer the tokenizer directory kvgate loads.
	Kvgate, Tokenizer string
	KvgateArgs        []string
	// Replicas is how many kvgate processes each kvgate policy runs (see Env.Replicas).
	Replicas       int
	RequestTimeout time.Duration // per request (default 60s)
	Progress       io.Writer     // nil = no progress bar
}

// PolicyResult is what one policy achieved.
type PolicyResult struct {
	Policy   string
	Requests int
	Errors   int
	FirstErr string
	TTFT     []time.Duration // sorted
	E2E      []time.Duration // sorted
	// Prompt and cached tokens as the engines reported them in usage.
	PromptTokens, CachedTokens int64
	Endpoints                  []enginesim.Stats
	// ReplicaRequests is how many requests each kvgate replica routed (with Replicas > 1).
	ReplicaRequests []int64
	Wall            time.Duration
}

// HitRatio is the delivered cache-hit ratio: cached / prompt tokens.
func (r *PolicyResult) HitRatio() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.CachedTokens) / float64(r.PromptTokens)
}

// Imbalance is the busiest engine's prefill work (uncached prompt tokens) over the mean:
// 1 is perfectly even, N means one of N engines did everything.
func (r *PolicyResult) Imbalance() float64 {
	return imbalance(r.Endpoints, func(s enginesim.Stats) float64 { return float64(s.PromptTokens - s.CachedTokens) })
}

// RequestImbalance is the same ratio over request counts.
func (r *PolicyResult) RequestImbalance() float64 {
	return imbalance(r.Endpoints, func(s enginesim.Stats) float64 { return float64(s.Requests) })
}

func imbalance(es []enginesim.Stats, f func(enginesim.Stats) float64) float64 {
	if len(es) == 0 {
		return 0
	}
	var sum, mx float64
	for _, e := range es {
		v := f(e)
		sum += v
		mx = max(mx, v)
	}
	if sum == 0 {
		return 0
	}
	return mx / (sum / float64(len(es)))
}

// Percentile returns the p-th percentile (0..100) of sorted durations (nearest rank).
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Result is a whole comparison.
type Result struct {
	Workload string
	Engines  int
	Sim      enginesim.Spec
	// KvgateArgs are the serve flags added to every kvgate policy.
	KvgateArgs []string
	Replicas   int // kvgate processes per kvgate policy
	Policies   []PolicyResult
}

// Run runs the workload once per policy, each against fresh engines.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Engines <= 0 {
		cfg.Engines = 4
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 60 * time.Second
	}
	res := &Result{Workload: cfg.Workload.Name, Engines: cfg.Engines, Sim: cfg.Sim, KvgateArgs: cfg.KvgateArgs, Replicas: max(cfg.Replicas, 1)}
	// A policy that cannot start is reported and skipped; the others still run.
	var errs []error
	for _, p := range cfg.Policies {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		pr, err := RunPolicy(ctx, cfg, p)
		if err != nil {
			errs = append(errs, fmt.Errorf("policy %s: %w", p.Name, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		res.Policies = append(res.Policies, *pr)
	}
	return res, errors.Join(errs...)
}

// startSims launches n engines from the template, each with its own event socket.
func startSims(cfg Config) ([]*enginesim.Sim, error) {
	var sims []*enginesim.Sim
	for i := 0; i < cfg.Engines; i++ {
		sp := cfg.Sim
		sp.Name = fmt.Sprintf("e%d", i)
		sp.Listen = "127.0.0.1:0"
		if sp.Engine != enginesim.EngineTRTLLM {
			sp.Events = "tcp://127.0.0.1:0"
		}
		s, err := enginesim.Launch(sp)
		if err != nil {
			for _, s := range sims {
				s.Close()
			}
			return nil, err
		}
		sims = append(sims, s)
	}
	return sims, nil
}

// RunPolicy starts fresh engines and the policy's router, replays the workload, and stops
// everything it started.
func RunPolicy(ctx context.Context, cfg Config, p Policy) (*PolicyResult, error) {
	if cfg.Engines <= 0 {
		cfg.Engines = 4
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 60 * time.Second
	}
	sims, err := startSims(cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, s := range sims {
			s.Close()
		}
	}()
	env := &Env{Sims: sims, Engine: sims[0].Config().Engine, HashAlgo: cfg.Sim.HashAlgo, HashSeed: cfg.Sim.HashSeed,
		SeedSet: cfg.Sim.SeedSet, BlockSize: sims[0].Config().Chain.BlockSize(), Model: sims[0].Config().Model,
		Tokenizer: cfg.Tokenizer, Kvgate: cfg.Kvgate, KvgateArgs: cfg.KvgateArgs, Replicas: cfg.Replicas}
	target, stop, err := p.Start(ctx, env)
	if err != nil {
		return nil, err
	}
	defer stop()
	pr := replay(ctx, cfg, p.Name, env.Model, target)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted: %w", err) // a partial run is no result
	}
	for _, s := range sims {
		pr.Endpoints = append(pr.Endpoints, s.Stats())
	}
	if rt, ok := target.(*replicaTarget); ok {
		pr.ReplicaRequests = rt.Routed()
	}
	return pr, nil
}

// replay runs every session of the workload against target and collects the samples.
func replay(ctx context.Context, cfg Config, name, model string, target Target) *PolicyResult {
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	total := cfg.Workload.Requests()
	var (
		mu      sync.Mutex
		samples = make([]Sample, 0, total)
		done    atomic.Int64
		wg      sync.WaitGroup
	)
	start := time.Now()
	stopBar := make(chan struct{})
	barDone := make(chan struct{})
	go func() {
		defer close(barDone)
		if cfg.Progress == nil {
			<-stopBar
			return
		}
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopBar:
				progress(cfg.Progress, name, int(done.Load()), total, time.Since(start))
				fmt.Fprintln(cfg.Progress)
				return
			case <-t.C:
				progress(cfg.Progress, name, int(done.Load()), total, time.Since(start))
			}
		}
	}()
	for i := range cfg.Workload.Sessions {
		sess := &cfg.Workload.Sessions[i]
		t := target
		if st, ok := target.(sessionTarget); ok {
			t = st.ForSession(i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !sleepUntil(ctx, start.Add(sess.At)) {
				return
			}
			runSession(ctx, cfg, hc, t, model, sess, func(s Sample) {
				mu.Lock()
				samples = append(samples, s)
				mu.Unlock()
				done.Add(1)
			})
		}()
	}
	wg.Wait()
	close(stopBar)
	<-barDone
	pr := &PolicyResult{Policy: name, Wall: time.Since(start)}
	for _, s := range samples {
		pr.Requests++
		if s.Err != nil {
			pr.Errors++
			if pr.FirstErr == "" {
				pr.FirstErr = s.Err.Error()
			}
			continue
		}
		pr.TTFT = append(pr.TTFT, s.TTFT)
		pr.E2E = append(pr.E2E, s.E2E)
		pr.PromptTokens += int64(s.PromptTokens)
		pr.CachedTokens += int64(s.CachedTokens)
	}
	slices.Sort(pr.TTFT)
	slices.Sort(pr.E2E)
	return pr
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// runSession sends a session's turns in order; a failed turn ends the session (its later
// turns would depend on the missing answer).
func runSession(ctx context.Context, cfg Config, hc *http.Client, target Target, model string, sess *Session, record func(Sample)) {
	var msgs []chatMessage
	if sess.Chat && sess.System != "" {
		msgs = append(msgs, chatMessage{Role: "system", Content: sess.System})
	}
	for t, prompt := range sess.Prompts {
		if t > 0 && sess.Think > 0 && !sleepUntil(ctx, time.Now().Add(sess.Think)) {
			return
		}
		rb := requestBody{Model: model, MaxTokens: max(sess.MaxTokens, 1), Stream: true, StreamOptions: &streamOptions{IncludeUsage: true}}
		path := "/v1/completions"
		if sess.Chat {
			msgs = append(msgs, chatMessage{Role: "user", Content: prompt})
			rb.Messages = msgs
			path = "/v1/chat/completions"
		} else {
			rb.Prompt = prompt
		}
		body, err := json.Marshal(&rb)
		if err != nil {
			record(Sample{Err: err})
			return
		}
		var base string
		var done func()
		routeStart := time.Now()
		if tt, ok := target.(trackedTarget); ok {
			base, done, err = tt.RouteTracked(body, sess.Chat)
		} else {
			base, err = target.Route(body, sess.Chat)
		}
		if err != nil {
			record(Sample{Err: fmt.Errorf("route: %w", err)})
			return
		}
		rctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
		routing := time.Since(routeStart)
		s := doStream(rctx, hc, base+path, body)
		cancel()
		if done != nil {
			done()
		}
		// A harness-side router (the oracle) decides before the request leaves, kvgate
		// while it holds it: both count in the client's time to first token.
		if s.Err == nil {
			s.TTFT += routing
			s.E2E += routing
		}
		record(s)
		if s.Err != nil {
			// Count the turns that will not run as failed too, so every policy reports
			// the same number of requests.
			for range sess.Prompts[t+1:] {
				record(Sample{Err: fmt.Errorf("skipped after an earlier turn failed: %w", s.Err)})
			}
			return
		}
		if sess.Chat {
			msgs = append(msgs, chatMessage{Role: "assistant", Content: s.Text})
		}
	}
}

// progress draws a one-line bar: policy, bar, done/total, elapsed.
func progress(w io.Writer, name string, done, total int, el time.Duration) {
	const width = 30
	n := 0
	if total > 0 {
		n = done * width / total
	}
	bar := make([]byte, width)
	for i := range bar {
		if i < n {
			bar[i] = '#'
		} else {
			bar[i] = '.'
		}
	}
	fmt.Fprintf(w, "\r  %-18s [%s] %4d/%-4d %5.1fs", name, bar, done, total, el.Seconds())
}

// IsTerminal reports whether f is a character device (a progress bar makes sense there).
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
