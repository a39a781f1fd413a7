package proxy

import (
	"bufio"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/ingest/enginepub"
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
