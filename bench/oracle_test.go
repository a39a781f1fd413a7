package bench

import (
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginesim"
)

func TestSlotWait(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	for _, c := range []struct {
		batch    int
		releases []time.Duration
		want     time.Duration
	}{
		{2, nil, 0},
		{2, ms(30), 0},                               // a free slot
		{2, ms(30, 10), 10 * time.Millisecond},       // full: the first release
		{2, ms(30, 10, 20), 20 * time.Millisecond},   // one queued ahead takes the first slot
		{1, ms(5, 50, 40, 7), 50 * time.Millisecond}, // one slot: after all four
		{3, ms(0, 0, 0), 0},                          // overdue requests free their slots now
	} {
		in := append([]time.Duration(nil), c.releases...)
		if got := slotWait(c.batch, c.releases); got != c.want {
			t.Errorf("slotWait(%d, %v) = %v, want %v", c.batch, c.releases, got, c.want)
		}
		for i := range in {
			if in[i] != c.releases[i] {
				t.Fatal("slotWait reordered its input")
			}
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
	m := latencyModel{MaxBatch: 2, PrefillBase: 5 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: time.Millisecond}
	// A free slot: base + 300 uncached tokens; others in prefill do not matter unshared.
	if got := predictTTFT(m, []time.Duration{time.Second}, []int{500}, 300); got != 35*time.Millisecond {
		t.Fatalf("free slot: %v, want 35ms", got)
	}
	// Full: wait for the earlier release (40ms), then a fully cached prompt costs the base.
	if got := predictTTFT(m, []time.Duration{90 * time.Millisecond, 40 * time.Millisecond}, nil, 0); got != 45*time.Millisecond {
		t.Fatalf("full batch: %v, want 45ms", got)
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
