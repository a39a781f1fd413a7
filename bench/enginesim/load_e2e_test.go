package enginesim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/proxy"
)

// kvgate reads each engine's own load report the way it serves it (vLLM and SGLang
// Prometheus gauges, trtllm-serve's /prometheus/metrics): with one request running and two
// waiting at the engine (another client's), kvgate's view of it shows running 1, waiting
// 2, a fresh report, and one slot learned from "running while requests wait".
func TestProxyReadsEngineLoad(t *testing.T) {
	for _, engine := range []string{EngineVLLM, EngineSGLang, EngineTRTLLM} {
		t.Run(engine, func(t *testing.T) {
			sp := pdSpec(t, engine, "", "e")
			sp.MaxBatch, sp.DecodePerToken = 1, 50*time.Millisecond
			sim := launch(t, sp)
			spec := fmt.Sprintf("name=e,url=%s,engine=%s", sim.URL(), engine)
			if a := sim.EventsAddr(); a != "" {
				spec += ",events=" + a
			}
			ep, err := proxy.ParseEndpoint(spec)
			if err != nil {
				t.Fatal(err)
			}
			cfg, pool := kvRule(t, proxy.KVConverged, engine)
			cfg.KV.LoadScrape = 20 * time.Millisecond
			cfg.Fleet.Endpoints = []proxy.EndpointSpec{ep}
			_, admURL := startProxy(t, cfg, pool)
			// Three long requests straight to the engine: one runs, two wait.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for i := 0; i < 3; i++ {
				go func(i int) {
					body := fmt.Sprintf(`{"model":"qwen3","prompt":"another client %d asks a long question","max_tokens":200,"stream":true}`, i)
					req, _ := http.NewRequestWithContext(ctx, "POST", sim.URL()+"/v1/completions", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					if res, err := http.DefaultClient.Do(req); err == nil {
						io.Copy(io.Discard, res.Body)
						res.Body.Close()
					}
				}(i)
			}
			deadline := time.Now().Add(10 * time.Second)
			var last string
			for time.Now().Before(deadline) {
				res, err := http.Get(admURL + "/debug/inventory")
				if err != nil {
					t.Fatal(err)
				}
				var inv struct {
					Endpoints []struct {
						Load struct {
							Slots  int64 `json:"slots"`
							Engine struct {
								Fresh            bool
								Running, Waiting int64
							} `json:"engine_report"`
						} `json:"load"`
					} `json:"endpoints"`
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				last = string(b)
				if json.Unmarshal(b, &inv) == nil && len(inv.Endpoints) == 1 {
					l := inv.Endpoints[0].Load
					if l.Engine.Fresh && l.Engine.Running == 1 && l.Engine.Waiting == 2 && l.Slots == 1 {
						return
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Fatalf("kvgate never saw running 1, waiting 2, slots 1:\n%s", last)
		})
	}
}
