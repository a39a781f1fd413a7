package bench

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
	"github.com/kvgate/kvgate/internal/testfix"
)

// tickAdmit is the engine's FCFS admission stepped one millisecond at a time: at each tick
// the requests due release their slot and blocks, then the queue's head is admitted while
// a slot and its blocks are free. It returns when the last request of queue is admitted.
func tickAdmit(maxBatch, free int, running []inFlight, queue []waiting) time.Duration {
	type r struct {
		release time.Duration
		blocks  int
	}
	var run []r
	for _, x := range running {
		run = append(run, r{x.release, x.blocks})
	}
	q := 0
	for t := time.Duration(0); ; t += time.Millisecond {
		kept := run[:0]
		for _, x := range run {
			if x.release <= t {
				free += x.blocks
			} else {
				kept = append(kept, x)
			}
		}
		run = kept
		for q < len(queue) && (len(run) < maxBatch && queue[q].blocks <= free || len(run) == 0) {
			free -= queue[q].blocks
			run = append(run, r{t + queue[q].service, queue[q].blocks})
			if q == len(queue)-1 {
				return t
			}
			q++
		}
	}
}

func TestAdmitWait(t *testing.T) {
	ms := func(v int) time.Duration { return time.Duration(v) * time.Millisecond }
	run := func(rel ...int) []inFlight {
		out := make([]inFlight, len(rel))
		for i, x := range rel {
			out[i] = inFlight{release: ms(x), blocks: 10}
		}
		return out
	}
	for _, c := range []struct {
		name    string
		batch   int
		free    int
		running []inFlight
		queue   []waiting
		blocks  int
		want    time.Duration
	}{
		{"idle", 2, 100, nil, nil, 10, 0},
		{"a free slot", 2, 100, run(30), nil, 10, 0},
		{"slots full: the first release", 2, 100, run(30, 10), nil, 10, ms(10)},
		{"one queued ahead takes the first slot", 2, 100, run(30, 10), []waiting{{10, ms(50)}}, 10, ms(30)},
		{"one slot: after all ahead", 1, 100, run(5), []waiting{{1, ms(50)}, {1, ms(7)}}, 1, ms(62)},
		{"overdue requests free their slots now", 3, 100, run(0, 0, 0), nil, 10, 0},
		{"blocks: wait for two releases", 8, 5, run(40, 20, 30), nil, 25, ms(30)},
		{"blocks: the queue's head holds the rest back", 8, 15, run(40), []waiting{{20, ms(5)}}, 1, ms(40)},
		{"never fits: when the engine is empty", 8, 0, run(10, 20), nil, 1000, ms(20)},
	} {
		in := slices.Clone(c.running)
		admits := make([]time.Duration, len(c.queue))
		if got := admitWait(c.batch, c.free, c.running, c.queue, c.blocks, admits); got != c.want {
			t.Errorf("%s: admitWait = %v, want %v", c.name, got, c.want)
		}
		if !slices.Equal(in, c.running) {
			t.Fatalf("%s: admitWait changed its input", c.name)
		}
		for k := range c.queue {
			if want := tickAdmit(c.batch, c.free, c.running, c.queue[:k+1]); admits[k] != want {
				t.Errorf("%s: queued %d admitted at %v, want %v", c.name, k, admits[k], want)
			}
		}
	}
	// Random engines against the millisecond-stepped admission.
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 2000; n++ {
		batch := 1 + r.IntN(4)
		free := r.IntN(60)
		var running []inFlight
		for range r.IntN(batch + 1) {
			running = append(running, inFlight{release: ms(r.IntN(50)), blocks: r.IntN(30)})
		}
		var queue []waiting
		for range r.IntN(4) {
			queue = append(queue, waiting{blocks: r.IntN(40), service: ms(1 + r.IntN(40))})
		}
		blocks := r.IntN(50)
		got := admitWait(batch, free, running, queue, blocks, nil)
		want := tickAdmit(batch, free, running, append(slices.Clone(queue), waiting{blocks: blocks, service: ms(1)}))
		if got != want {
			t.Fatalf("batch %d free %d running %v queue %v blocks %d: admitWait %v, stepped %v", batch, free, running, queue, blocks, got, want)
		}
	}
}

// psFinish simulates egalitarian processor sharing in small steps: the engine does one
// token per unit of time split equally among the jobs present; it returns when the job
// with newWork tokens, arriving beside jobs with rest tokens left, finishes.
func psFinish(rest []int, newWork int) float64 {
	left := []float64{float64(newWork)}
	for _, r := range rest {
		left = append(left, float64(r))
	}
	const dt = 1e-3
	t := 0.0
	for left[0] > 1e-9 {
		n := 0
		for _, l := range left {
			if l > 1e-9 {
				n++
			}
		}
		for i := range left {
			if left[i] > 1e-9 {
				left[i] -= dt / float64(n)
			}
		}
		t += dt
	}
	return t
}

func TestPredictTTFT(t *testing.T) {
	m := latencyModel{MaxBatch: 2, BlockSize: 16, PrefillBase: 5 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: time.Millisecond}
	// A free slot and blocks: base + 300 uncached tokens; others in prefill do not matter unshared.
	if w, got := predictTTFT(m, 100, []inFlight{{time.Second, 1}}, nil, []int{500}, 20, 300, nil); w != 0 || got != 35*time.Millisecond {
		t.Fatalf("free slot: wait %v ttft %v, want 0 and 35ms", w, got)
	}
	// Full: wait for the earlier release (40ms), then a fully cached prompt costs the base.
	if w, got := predictTTFT(m, 100, []inFlight{{90 * time.Millisecond, 1}, {40 * time.Millisecond, 1}}, nil, nil, 1, 0, nil); w != 40*time.Millisecond || got != 45*time.Millisecond {
		t.Fatalf("full batch: wait %v ttft %v, want 40ms and 45ms", w, got)
	}
	// Shared prefill against a step-by-step processor-sharing simulation.
	m.SharedPrefill = true
	for _, c := range []struct {
		rest []int
		u    int
	}{{nil, 200}, {[]int{50}, 200}, {[]int{400, 100, 10}, 200}, {[]int{1000, 1000}, 30}} {
		got := prefillTime(m, c.u, c.rest) - m.PrefillBase
		want := psFinish(c.rest, c.u) * float64(m.PrefillPerToken)
		if math.Abs(float64(got)-want) > 0.002*want+float64(time.Microsecond) {
			t.Errorf("shared prefill of %d beside %v: %v, want %v", c.u, c.rest, got, time.Duration(want))
		}
	}
}

// The oracle on two real simulators: a cached prefix wins while its engine has a free
// slot; once that engine's only slot is taken for long, the cold engine wins; when the
// wait is short the cached engine still wins; done frees the slot.
func TestOracleRoutesOnPredictedTTFT(t *testing.T) {
	var sims []*enginesim.Sim
	for range 2 {
		s, err := enginesim.Launch(enginesim.Spec{Name: "e", Model: "m", Encoder: enginesim.WordEncoder{}, BlockSize: 4, NumBlocks: 1024,
			MaxBatch: 1, PrefillBase: time.Millisecond, PrefillPerToken: time.Millisecond, DecodePerToken: time.Millisecond, Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sims = append(sims, s)
	}
	prefix := strings.Repeat("shared words here ", 40) // 120 words
	body := func(suffix string, maxTokens int) []byte {
		b, _ := json.Marshal(requestBody{Model: "m", Prompt: prefix + suffix, MaxTokens: maxTokens})
		return b
	}
	// Warm sims[1] with the prefix.
	resp, err := http.Post(sims[1].URL()+"/v1/completions", "application/json", strings.NewReader(string(body(" warm", 1))))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	o := newOracle(sims)
	route := func(b []byte) (int, func()) {
		t.Helper()
		base, done, err := o.RouteTracked(b, false)
		if err != nil {
			t.Fatal(err)
		}
		return map[string]int{sims[0].URL(): 0, sims[1].URL(): 1}[base], done
	}
	// Cached on 1 (120 of ~124 tokens): about 5 ms there against 125 ms cold on 0.
	i, doneLong := route(body(" a", 1000))
	if i != 1 {
		t.Fatalf("cached prefix went to engine %d, want 1", i)
	}
	// Engine 1's one slot is now held for about a second (1000 decode tokens): cold engine 0 wins.
	i, doneCold := route(body(" b", 1))
	if i != 0 {
		t.Fatalf("with engine 1 busy for a second, went to %d, want 0", i)
	}
	doneCold()
	doneLong()
	// Freed: engine 1 wins again, and a short request there ...
	i, doneShort := route(body(" c", 2))
	if i != 1 {
		t.Fatalf("after done, went to %d, want 1", i)
	}
	// ... holds its slot for a few ms only: waiting for it beats a cold prefill on the idle
	// engine 0.
	if i, _ := route(body(" d", 1)); i != 1 {
		t.Fatalf("short wait on the cached engine lost: went to %d", i)
	}
	doneShort()
}

// When the cached engine's KV pool cannot hold a second request until the first one ends,
// the oracle's admission model waits for that release and sends the request to the cold
// engine instead; a free batch slot alone would have kept it on the cached one.
func TestOracleWaitsForPoolBlocks(t *testing.T) {
	var sims []*enginesim.Sim
	for range 2 {
		s, err := enginesim.Launch(enginesim.Spec{Name: "e", Model: "m", Encoder: enginesim.WordEncoder{}, BlockSize: 4, NumBlocks: 100,
			MaxBatch: 8, PrefillBase: time.Millisecond, PrefillPerToken: time.Millisecond, DecodePerToken: 4 * time.Millisecond, Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sims = append(sims, s)
	}
	prefix := strings.Repeat("shared words here ", 40) // 120 words: 121 tokens with BOS, 30 full blocks
	body := func(suffix string, maxTokens int) []byte {
		b, _ := json.Marshal(requestBody{Model: "m", Prompt: prefix + suffix, MaxTokens: maxTokens, Stream: true})
		return b
	}
	resp, err := http.Post(sims[1].URL()+"/v1/completions", "application/json", strings.NewReader(string(body(" warm", 1))))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	o := newOracle(sims)
	engine := func(base string) int { return map[string]int{sims[0].URL(): 0, sims[1].URL(): 1}[base] }
	// A: cached on 1; needs (123+200)/4 = 81 blocks, 51 of them new, for about 800 ms.
	a := body(" a", 200)
	base, done, err := o.RouteTracked(a, false)
	if err != nil || engine(base) != 1 {
		t.Fatalf("first request: engine %d (%v), want 1", engine(base), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		defer done()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(string(a)))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	for sims[1].Stats().Running != 1 {
		time.Sleep(time.Millisecond)
	}
	// B on engine 1 would need 51 new blocks with 19 free: admitted only when A ends (about
	// 800 ms). Cold on engine 0: 1 + 123 x 1 ms.
	if base, _, err := o.RouteTracked(body(" b", 200), false); err != nil || engine(base) != 0 {
		t.Fatalf("second request: engine %d (%v), want 0 (engine 1's pool is full until the first ends)", engine(base), err)
	}
	// A short answer fits beside A: (123+1)/4 = 31 blocks, 30 cached, 1 new: engine 1.
	if base, _, err := o.RouteTracked(body(" c", 1), false); err != nil || engine(base) != 1 {
		t.Fatalf("small request: engine %d (%v), want 1", engine(base), err)
	}
	cancel()
	<-finished
}

// The oracle's one tokenization per request probes each engine's pool exactly as the
// engine's own /debug/probe does (prompt and cached tokens), for chats and completions
// with the real Qwen3 tokenizer and template; bodies it cannot read that way (cache salt,
// tools, another model) go to the engines' own probe.
func TestOracleProbeMatchesEngineProbe(t *testing.T) {
	enc, err := enginesim.LoadEncoder("qwen3", testfix.TokenizerDir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	var sims []*enginesim.Sim
	for range 2 {
		s, err := enginesim.Launch(enginesim.Spec{Name: "e", Model: "qwen3", Encoder: enc, BlockSize: 16, NumBlocks: 512, MaxBatch: 4,
			HashAlgo: "sha256_cbor", Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sims = append(sims, s)
	}
	words := FilterWords(enc, Words)
	system := Text(words, 5, 300)
	chat := func(user string) []byte {
		b, _ := json.Marshal(requestBody{Model: "qwen3", MaxTokens: 3, Messages: []chatMessage{{Role: "system", Content: system}, {Role: "user", Content: user}}})
		return b
	}
	completion, _ := json.Marshal(requestBody{Model: "qwen3", MaxTokens: 2, Prompt: system + " and more"})
	// Warm engine 1 with the chat prefix and engine 0 with the completion.
	for i, b := range [][]byte{completion, chat("warm")} {
		path := "/v1/completions"
		if i == 1 {
			path = "/v1/chat/completions"
		}
		resp, err := http.Post(sims[i].URL()+path, "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	o := newOracle(sims)
	cached := 0
	for _, c := range []struct {
		body []byte
		chat bool
	}{{chat("a question" + Text(words, 9, 40)), true}, {completion, false}, {chat("x"), true}} {
		tokens, keys, maxNew := o.prompt(c.body, c.chat)
		if tokens == nil || maxNew < 2 {
			t.Fatalf("%.60s: not tokenized once (max_tokens %d)", c.body, maxNew)
		}
		for i, s := range sims {
			want, err := s.ProbeBody(c.body, c.chat)
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := o.probe(i, c.body, c.chat, tokens, keys)
			if err != nil || got != want {
				t.Fatalf("engine %d, %.60s: oracle probe %+v, engine probe %+v (%v)", i, c.body, got, want, err)
			}
			cached += got.CachedTokens
		}
	}
	if cached < 3*256 { // each probe hits at least 16 of its ~19 blocks somewhere
		t.Fatalf("only %d cached tokens probed: the warm-up did not cache the prefixes", cached)
	}
	for _, b := range []string{`{"model":"qwen3","prompt":"hi","cache_salt":"s"}`, `{"model":"lora1","prompt":"hi"}`,
		`{"model":"qwen3","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}`, `{"prompt":[1,2,3]}`} {
		if tokens, _, _ := o.prompt([]byte(b), !strings.Contains(b, "prompt")); tokens != nil {
			t.Errorf("%s: tokenized by the oracle, want the engines' own probe", b)
		}
	}
}
