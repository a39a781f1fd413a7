package proxy

import (
	"bufio"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// /metrics reports what the rule holds in memory: the inventory (bytes and unique keys)
// and each loaded tokenizer.
func TestMemoryMetrics(t *testing.T) {
	c := vllmChain(t)
	a := newKVEngine(t, "a", enginepub.VLLM)
	s := startProxy(t, kvConfig(t, KVConverged, a.spec(0, "vllm", "")))
	toks := engineTokens(t, sharedPrefix)
	a.store(t, c, toks, 5)
	waitFor(t, "events applied", func() bool { return s.kv.inv.Count(0) == 5 })

	got := scrapeMetrics(t, s)
	if got["kvgate_inventory_unique_keys"] != 5 {
		t.Errorf("kvgate_inventory_unique_keys = %v, want 5", got["kvgate_inventory_unique_keys"])
	}
	if got["kvgate_inventory_memory_bytes"] <= 0 {
		t.Errorf("kvgate_inventory_memory_bytes = %v", got["kvgate_inventory_memory_bytes"])
	}
	// Qwen3's vocabulary alone is 151k tokens: its tokenizer cannot fit in 1 MiB.
	if m := got[`kvgate_tokenizer_memory_bytes{model="qwen3"}`]; m < 1<<20 {
		t.Errorf("kvgate_tokenizer_memory_bytes{model=\"qwen3\"} = %v", m)
	}
}

// scrapeMetrics reads the admin /metrics page into name{labels} -> value.
func scrapeMetrics(t *testing.T, s *Server) map[string]float64 {
	t.Helper()
	res, err := httpc.Get(s.admURL("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	got := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			got[name] = v
		}
	}
	return got
}

// -kv-max-keys-per-endpoint bounds what one endpoint's events can make the inventory
// hold: beyond it each new key evicts an older key of the endpoint from its own shard,
// or, when that shard holds none, is not added (shard.Config); both are counted on
// /metrics.
func TestInventoryBoundPerEndpoint(t *testing.T) {
	c := vllmChain(t)
	a := newKVEngine(t, "a", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""))
	cfg.KV.MaxKeysPerEndpoint = 3
	s := startProxy(t, cfg)
	a.store(t, c, engineTokens(t, sharedPrefix), 5)
	waitFor(t, "events applied", func() bool {
		st := s.kv.inv.Stats()
		return st.EvictedAtBound+st.DroppedAtBound == 2
	})
	got := scrapeMetrics(t, s)
	if got[`kvgate_ingest_inventory_keys{endpoint="a"}`] != 3 || got["kvgate_inventory_unique_keys"] != 3 {
		t.Errorf("inventory keys %v / unique %v, want 3 (the bound)",
			got[`kvgate_ingest_inventory_keys{endpoint="a"}`], got["kvgate_inventory_unique_keys"])
	}
	if n := got["kvgate_inventory_evicted_total"] + got["kvgate_inventory_dropped_total"]; n != 2 ||
		got["kvgate_inventory_max_keys_per_endpoint"] != 3 {
		t.Errorf("evicted+dropped %v (want 2), bound %v (want 3)", n, got["kvgate_inventory_max_keys_per_endpoint"])
	}
}
