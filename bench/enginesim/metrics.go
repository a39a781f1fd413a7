package enginesim

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// The load metrics each engine flavour exposes, under the engine's own names, types and
// labels (docs/CONTRACTS.md, "Engine load metrics", cites the sources). A load-aware router
// reads these from real engines; the simulator serves the same so it can be tested here.

// promText appends Prometheus text exposition (format 0.0.4) into b.
type promText struct {
	b      []byte
	labels string // the common label pairs, without braces
}

// family starts a metric family: its HELP and TYPE lines.
func (p *promText) family(name, typ, help string) {
	p.b = append(p.b, "# HELP "...)
	p.b = append(p.b, name...)
	p.b = append(p.b, ' ')
	p.b = append(p.b, help...)
	p.b = append(p.b, "\n# TYPE "...)
	p.b = append(p.b, name...)
	p.b = append(p.b, ' ')
	p.b = append(p.b, typ...)
	p.b = append(p.b, '\n')
}

// sample appends one sample with the common labels plus extra (`k="v"` pairs or "").
func (p *promText) sample(name, extra string, v float64) {
	p.b = append(p.b, name...)
	p.b = append(p.b, '{')
	p.b = append(p.b, p.labels...)
	if extra != "" {
		p.b = append(p.b, ',')
		p.b = append(p.b, extra...)
	}
	p.b = append(p.b, "} "...)
	p.b = strconv.AppendFloat(p.b, v, 'g', -1, 64)
	p.b = append(p.b, '\n')
}

func (p *promText) gauge(name, help string, v float64) {
	p.family(name, "gauge", help)
	p.sample(name, "", v)
}

func (p *promText) counter(name, help string, v uint64) {
	p.family(name, "counter", help)
	p.sample(name, "", float64(v))
}

// labelValue quotes s as a Prometheus label value (backslash, quote and newline escaped).
func labelValue(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\', '"':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// loadSnapshot is what every flavour's metrics are computed from.
type loadSnapshot struct {
	running, waiting, prefilling int
	pool                         PoolStats
	blockSize                    int
	promptTok, cachedTok, genTok uint64
	reqOK                        uint64
}

// add sums o into l: what a server in front of several cores reports as one engine.
func (l *loadSnapshot) add(o *loadSnapshot) {
	l.running += o.running
	l.waiting += o.waiting
	l.prefilling += o.prefilling
	l.pool.Blocks += o.pool.Blocks
	l.pool.Free += o.pool.Free
	l.pool.Cached += o.pool.Cached
	l.pool.QueryTokens += o.pool.QueryTokens
	l.pool.HitTokens += o.pool.HitTokens
	l.promptTok += o.promptTok
	l.cachedTok += o.cachedTok
	l.genTok += o.genTok
	l.reqOK += o.reqOK
}

func (s *Sim) loadSnapshot() loadSnapshot {
	run, wait := s.sched.load()
	l := loadSnapshot{running: run, waiting: wait, prefilling: int(s.prefilling.Load()), pool: s.pool.Stats(),
		blockSize: s.pool.BlockSize(), promptTok: s.promptTok.Load(), cachedTok: s.cachedTok.Load(),
		genTok: s.genTok.Load(), reqOK: s.reqOK.Load()}
	// The two counts are read apart: a request between them must not make decode negative.
	l.prefilling = min(l.prefilling, l.running)
	return l
}

// usage is the fraction of blocks held by running requests: cached blocks nobody holds are
// free (evictable), as in vLLM's kv_cache_usage and SGLang's token_usage.
func (l *loadSnapshot) usage() float64 {
	if l.pool.Blocks == 0 {
		return 0
	}
	return 1 - float64(l.pool.Free)/float64(l.pool.Blocks)
}

func (s *Sim) serveMetrics(w http.ResponseWriter, r *http.Request) {
	l := s.loadSnapshot()
	var b []byte
	switch s.cfg.Engine {
	case EngineSGLang:
		b = s.appendSGLangMetrics(b, &l)
	case EngineTRTLLM:
		s.serveTRTIterationStats(w, &l)
		return
	default:
		b = s.appendVLLMMetrics(b, &l)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write(b)
}

// appendVLLMMetrics: vLLM v1's PrometheusStatLogger, labels model_name and engine (the
// engine core index; one core here).
func (s *Sim) appendVLLMMetrics(b []byte, l *loadSnapshot) []byte {
	return appendVLLMCores(b, []*Sim{s}, []loadSnapshot{*l})
}

// appendVLLMCores writes each family once with one sample per engine core: the API server
// of a data-parallel vLLM exposes every core's gauges under its index (engine="r").
func appendVLLMCores(b []byte, cores []*Sim, ls []loadSnapshot) []byte {
	p := promText{b: b}
	each := func(name, typ, help, extra string, v func(l *loadSnapshot) float64) {
		p.family(name, typ, help)
		for i, c := range cores {
			p.labels = "model_name=" + string(labelValue(nil, c.cfg.Model)) + `,engine="` + strconv.Itoa(c.cfg.EngineIndex) + `"`
			p.sample(name, extra, v(&ls[i]))
		}
	}
	each("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", "", func(l *loadSnapshot) float64 { return float64(l.running) })
	each("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", "", func(l *loadSnapshot) float64 { return float64(l.waiting) })
	each("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", "", func(l *loadSnapshot) float64 { return l.usage() })
	each("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", "", func(l *loadSnapshot) float64 { return float64(l.pool.QueryTokens) })
	each("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", "", func(l *loadSnapshot) float64 { return float64(l.pool.HitTokens) })
	each("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "", func(l *loadSnapshot) float64 { return float64(l.promptTok) })
	each("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", "", func(l *loadSnapshot) float64 { return float64(l.genTok) })
	// Every simulated request stops at max_tokens: finished_reason is always "length".
	each("vllm:request_success_total", "counter", "Count of successfully processed requests.", `finished_reason="length"`, func(l *loadSnapshot) float64 { return float64(l.reqOK) })
	return p.b
}

// appendSGLangMetrics: SGLang's SchedulerMetricsCollector (labels model_name, engine_type,
// tp_rank, pp_rank) and TokenizerMetricsCollector (label model_name).
func (s *Sim) appendSGLangMetrics(b []byte, l *loadSnapshot) []byte {
	model := "model_name=" + string(labelValue(nil, s.cfg.Model))
	p := promText{b: b, labels: model + `,engine_type="unified",tp_rank="0",pp_rank="0"`}
	maxTokens := l.pool.Blocks * l.blockSize
	p.gauge("sglang:num_running_reqs", "The number of running requests.", float64(l.running))
	p.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", float64(l.waiting))
	p.gauge("sglang:num_used_tokens", "The number of used tokens.", float64((l.pool.Blocks-l.pool.Free)*l.blockSize))
	p.gauge("sglang:token_usage", "The token usage.", l.usage())
	p.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", float64(maxTokens))
	var rate float64
	if l.pool.QueryTokens > 0 {
		rate = float64(l.pool.HitTokens) / float64(l.pool.QueryTokens)
	}
	p.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", rate)
	switch {
	case s.boot != nil:
		p.gauge("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue.", float64(s.boot.inflight()))
	case s.cfg.Role == RoleDecode:
		p.gauge("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.", float64(s.transferring.Load()))
	}
	p.labels = model
	p.counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", l.promptTok)
	p.counter("sglang:generation_tokens_total", "Number of generation tokens processed.", l.genTok)
	p.counter("sglang:cached_tokens_total", "Number of cached prompt tokens.", l.cachedTok)
	p.counter("sglang:num_requests_total", "Number of requests processed.", l.reqOK)
	return p.b
}

// serveTRTPrometheus is trtllm-serve's GET /prometheus/metrics (MetricsCollector, prefix
// trtllm_; trtllm-serve labels every series model_name="undefined",engine_type="undefined").
func (s *Sim) serveTRTPrometheus(w http.ResponseWriter, r *http.Request) {
	l := s.loadSnapshot()
	p := promText{labels: `model_name="undefined",engine_type="undefined"`}
	used := l.pool.Blocks - l.pool.Free
	p.gauge("trtllm_num_requests_running", "Number of active requests", float64(l.running))
	p.gauge("trtllm_num_requests_waiting", "Number of queued requests", float64(l.waiting))
	p.gauge("trtllm_kv_cache_utilization", "KV cache utilization", l.usage())
	p.gauge("trtllm_kv_cache_hit_rate", "KV cache hit rate", trtHitRate(&l))
	p.gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", float64(l.pool.Blocks))
	p.gauge("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks", float64(l.pool.Free))
	p.gauge("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks", float64(used))
	p.gauge("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block", float64(l.blockSize))
	p.gauge("trtllm_num_context_requests", "Number of context (prefill) requests in the iteration", float64(l.prefilling))
	p.gauge("trtllm_num_generation_requests", "Number of generation requests in the iteration", float64(l.running-l.prefilling))
	p.counter("trtllm_prompt_tokens_total", "Cumulative number of prompt (input) tokens processed.", l.promptTok)
	p.counter("trtllm_generation_tokens_total", "Cumulative number of generation (output) tokens produced.", l.genTok)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write(p.b)
}

func trtHitRate(l *loadSnapshot) float64 {
	if l.pool.QueryTokens == 0 {
		return 0
	}
	return float64(l.pool.HitTokens) / float64(l.pool.QueryTokens)
}

// TRTIterationStats is one element of trtllm-serve's GET /metrics answer: the executor's
// per-iteration stats as JSON (camelCase, as the C++ executor serialises them). Only the
// fields a router or `kvgate doctor` reads for load are filled.
type TRTIterationStats struct {
	Iter                  uint64              `json:"iter"`
	IterLatencyMS         float64             `json:"iterLatencyMS"`
	NumActiveRequests     int                 `json:"numActiveRequests"`
	NumQueuedRequests     int                 `json:"numQueuedRequests"`
	NumCompletedRequests  uint64              `json:"numCompletedRequests"`
	MaxNumActiveRequests  int                 `json:"maxNumActiveRequests"`
	KVCacheStats          TRTKVCacheStats     `json:"kvCacheStats"`
	InflightBatchingStats TRTInflightBatching `json:"inflightBatchingStats"`
}

// TRTKVCacheStats is iteration stats' kvCacheStats.
type TRTKVCacheStats struct {
	MaxNumBlocks   int     `json:"maxNumBlocks"`
	FreeNumBlocks  int     `json:"freeNumBlocks"`
	UsedNumBlocks  int     `json:"usedNumBlocks"`
	TokensPerBlock int     `json:"tokensPerBlock"`
	ReusedBlocks   uint64  `json:"reusedBlocks"`
	MissedBlocks   uint64  `json:"missedBlocks"`
	CacheHitRate   float64 `json:"cacheHitRate"`
}

// TRTInflightBatching is iteration stats' inflightBatchingStats.
type TRTInflightBatching struct {
	NumScheduledRequests int `json:"numScheduledRequests"`
	NumContextRequests   int `json:"numContextRequests"`
	NumGenRequests       int `json:"numGenRequests"`
	NumPausedRequests    int `json:"numPausedRequests"`
}

// serveTRTIterationStats answers GET /metrics in TensorRT-LLM mode. trtllm-serve drains the
// stats of the iterations run since the last call (an empty list when idle); the simulator
// has no iterations, so it answers one element describing the engine now, with
// numCompletedRequests counting the requests finished since the previous call.
func (s *Sim) serveTRTIterationStats(w http.ResponseWriter, l *loadSnapshot) {
	done := l.reqOK
	prev := s.trtCompleted.Swap(done)
	hitBlocks := l.pool.HitTokens / uint64(max(l.blockSize, 1))
	queryBlocks := l.pool.QueryTokens / uint64(max(l.blockSize, 1))
	st := TRTIterationStats{
		Iter:                 s.trtIter.Add(1),
		IterLatencyMS:        float64(s.cfg.DecodePerToken) / float64(time.Millisecond), // one decode step
		NumActiveRequests:    l.running,
		NumQueuedRequests:    l.waiting,
		NumCompletedRequests: done - min(prev, done),
		MaxNumActiveRequests: s.cfg.MaxBatch,
		KVCacheStats: TRTKVCacheStats{MaxNumBlocks: l.pool.Blocks, FreeNumBlocks: l.pool.Free, UsedNumBlocks: l.pool.Blocks - l.pool.Free,
			TokensPerBlock: l.blockSize, ReusedBlocks: hitBlocks, MissedBlocks: queryBlocks - min(hitBlocks, queryBlocks), CacheHitRate: trtHitRate(l)},
		InflightBatchingStats: TRTInflightBatching{NumScheduledRequests: l.running, NumContextRequests: l.prefilling,
			NumGenRequests: l.running - l.prefilling},
	}
	b, _ := json.Marshal([]TRTIterationStats{st})
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}
