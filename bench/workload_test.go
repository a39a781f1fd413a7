package bench

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// prefixIndex reads which hot system prompt a session carries.
func prefixIndex(t *testing.T, s Session) int {
	t.Helper()
	var k int
	if _, err := fmt.Sscanf(s.System, "You are hot assistant %d.", &k); err != nil {
		t.Fatalf("system prompt %.40q: %v", s.System, err)
	}
	return k
}

func TestHotPrefixDeterministic(t *testing.T) {
	c := HotPrefix{Prefixes: 4, PrefixTokens: [2]int{50, 80}, Requests: 200, SuffixTokens: 6, MaxTokens: 3,
		Window: 2 * time.Second, Zipf: 1.1, Seed: 7}
	a, b := c.Build(), c.Build()
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed must build the same workload")
	}
	c.Seed = 8
	if d := c.Build(); reflect.DeepEqual(a.Sessions[5], d.Sessions[5]) {
		t.Fatal("another seed built the same request")
	}
	if a.Requests() != 200 || len(a.Sessions) != 200 {
		t.Fatalf("%d requests", a.Requests())
	}
	seen := map[string]bool{}
	systems := map[int]string{}
	for i, s := range a.Sessions {
		if !s.Chat || len(s.Prompts) != 1 || s.MaxTokens != 3 {
			t.Fatalf("session %d: %+v", i, s)
		}
		if i > 0 && s.At < a.Sessions[i-1].At {
			t.Fatalf("arrivals out of order at %d", i)
		}
		if seen[s.Prompts[0]] {
			t.Fatalf("request %d repeats a user message", i)
		}
		seen[s.Prompts[0]] = true
		k := prefixIndex(t, s)
		if prev, ok := systems[k]; ok && prev != s.System {
			t.Fatalf("prefix %d has two texts", k)
		}
		systems[k] = s.System
		if n := len(strings.Fields(s.System)) - 4; n < 50 || n > 80 {
			t.Fatalf("prefix %d: %d words, want 50..80", k, n)
		}
	}
}

// Prefix k is drawn with probability (k+1)^-s / H, and arrivals are Poisson: exponential
// gaps with mean Window/Requests (coefficient of variation 1).
func TestHotPrefixZipfAndPoisson(t *testing.T) {
	const n, k = 20000, 6
	for _, s := range []float64{1.1, 0} {
		w := HotPrefix{Prefixes: k, PrefixTokens: [2]int{5, 5}, Requests: n, SuffixTokens: 1, Window: 100 * time.Second, Zipf: s, Seed: 3}.Build()
		var count [k]int
		for _, sess := range w.Sessions {
			count[prefixIndex(t, sess)]++
		}
		var h float64
		for i := 0; i < k; i++ {
			h += math.Pow(float64(i+1), -s)
		}
		for i := 0; i < k; i++ {
			p := math.Pow(float64(i+1), -s) / h
			sd := math.Sqrt(n * p * (1 - p))
			if d := math.Abs(float64(count[i]) - n*p); d > 4*sd {
				t.Errorf("s=%g: prefix %d drawn %d times, want %.0f +- %.0f", s, i, count[i], n*p, 4*sd)
			}
		}
		if s > 0 && !(count[0] > 2*count[2] && count[2] > count[5]) {
			t.Errorf("s=%g: counts %v are not skewed", s, count)
		}
		var sum, sq float64
		for i := 1; i < n; i++ {
			g := (w.Sessions[i].At - w.Sessions[i-1].At).Seconds()
			sum += g
			sq += g * g
		}
		mean := sum / (n - 1)
		cv := math.Sqrt(sq/(n-1)-mean*mean) / mean
		if math.Abs(mean-0.005) > 0.0003 || math.Abs(cv-1) > 0.05 {
			t.Errorf("s=%g: inter-arrival mean %.5fs (want 0.005), cv %.3f (want 1)", s, mean, cv)
		}
	}
}
