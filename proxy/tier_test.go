package proxy

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
)

// publish sends events from e once kvgate subscribed.
func (e *kvEngine) publish(t *testing.T, evs ...enginepub.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.pub.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.pub.Publish(evs...); err != nil {
		t.Fatal(err)
	}
}

// TestKVTierWeights, end to end over ZeroMQ with vLLM's offload events (medium "CPU"):
// a holds 2 of the prompt's blocks on its GPU and all of them in host memory, b holds 4
// on its GPU. At the default CPU weight (0.06 of a prefill per token) a's CPU blocks make
// it the cheaper first token; /debug/explain shows the per-tier blocks and the weighted
// uncached tokens. With -kv-tier-weight-cpu 1 (CPU not indexed) b wins; once a's CPU
// drops the blocks, b wins too.
func TestKVTierWeights(t *testing.T) {
	c := vllmChain(t)
	toks := engineTokens(t, sharedPrefix)
	n := len(toks) / blockSize
	keys := hashcore.Keys(c, nil, toks[:n*blockSize], nil)
	for _, cpuWeight := range []float64{DefaultTierWeightCPU, 1} {
		a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
		cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""))
		cfg.KV.PrefillRate = 10000
		cfg.KV.PendingTTL = 0
		cfg.KV.TierWeightCPU = cpuWeight
		s := startProxy(t, cfg)
		a.publish(t, enginepub.BlockStored{Hashes: keys[:2], TokenIDs: toks[:2*blockSize], BlockSize: blockSize})
		a.publish(t, enginepub.BlockStored{Hashes: keys, TokenIDs: toks[:n*blockSize], BlockSize: blockSize, Medium: "CPU"})
		b.store(t, c, toks, 4)
		waitFor(t, "events", func() bool {
			cpuHeld := s.kv.mgr.Status(0).Tiers["CPU"] == int64(n) // counted whether indexed or not
			if s.ranks.cpu >= 0 {
				cpuHeld = s.kv.inv.Count(s.ranks.cpu) == n
			}
			return cpuHeld && s.kv.inv.Count(0) == 2 && s.kv.inv.Count(1) == 4
		})
		res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
		want := "a"
		if cpuWeight == 1 {
			want = "b"
		}
		if got := res.Header.Get("x-kvgate-endpoint"); got != want || res.Header.Get("x-kvgate-route") != "kv-hit" {
			t.Fatalf("cpu weight %v: routed to %s (%s), want %s", cpuWeight, got, res.Header.Get("x-kvgate-route"), want)
		}
		_, body := post(t, s.admURL("/debug/explain"), complPrompt(sharedPrefix))
		var ex Explanation
		if err := json.Unmarshal([]byte(body), &ex); err != nil {
			t.Fatal(err)
		}
		ta, tb := ex.Terms["a"], ex.Terms["b"]
		if cpuWeight == 1 {
			if ta.Matched != 2 || ta.CPU != 0 || tb.Matched != 4 {
				t.Fatalf("CPU tier off: explain %s", body)
			}
			continue
		}
		// a: the prompt past its n blocks, plus n-2 CPU blocks at 0.06 of a prefill each.
		wantA := len(toks) - n*blockSize + int(math.Round(float64((n-2)*blockSize)*DefaultTierWeightCPU))
		if ta.Matched != int32(n) || ta.CPU != int32(n-2) || ta.Storage != 0 || ta.Uncached != wantA ||
			ta.GPUTokens != 2*blockSize || ta.CPUTokens != (n-2)*blockSize || tb.GPUTokens != 4*blockSize ||
			tb.Matched != 4 || tb.CPU != 0 || tb.Uncached != len(toks)-4*blockSize || ex.Endpoint != "a" {
			t.Fatalf("explain (want a uncached %d): %s", wantA, body)
		}
		// The GPU evicts a's 2 blocks: the CPU copy still counts.
		a.publish(t, enginepub.BlockRemoved{Hashes: keys[:2]})
		waitFor(t, "gpu eviction", func() bool { return s.kv.inv.Count(0) == 0 })
		if res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)); res.Header.Get("x-kvgate-endpoint") != "a" {
			t.Fatalf("after a's GPU eviction: %s", res.Header.Get("x-kvgate-endpoint"))
		}
		// The CPU drops them too: b holds the most.
		a.publish(t, enginepub.BlockRemoved{Hashes: keys, Medium: "CPU"})
		waitFor(t, "cpu eviction", func() bool { return s.kv.inv.Count(s.ranks.cpu) == 0 })
		if res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)); res.Header.Get("x-kvgate-endpoint") != "b" {
			t.Fatalf("after a's CPU eviction: %s", res.Header.Get("x-kvgate-endpoint"))
		}
	}
}
