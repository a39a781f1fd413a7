package route

import (
	"bytes"
	"encoding/json"
	"iter"
	"strconv"
)

// The engine gauges the cost policy reads from each engine's /metrics, by engine (see
// docs/CONTRACTS.md, "Engine load metrics"). A family may carry several label sets (one
// per model or engine index): running and waiting add up, KV usage takes the fullest.
var (
	runningNames = [...]string{"vllm:num_requests_running", "sglang:num_running_reqs", "trtllm_num_requests_running"}
	waitingNames = [...]string{"vllm:num_requests_waiting", "sglang:num_queue_reqs", "trtllm_num_requests_waiting"}
	kvUsageNames = [...]string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
		"trtllm_kv_cache_utilization"}
)

// ParseReport reads an engine's /metrics body: Prometheus text (vLLM, SGLang) or
// TensorRT-LLM's JSON list of iteration stats (the newest entry counts; an empty list is an
// idle engine: no iteration ran since the last read). ok is false when
// the body names neither a running nor a waiting count: garbage, or an engine kvgate does
// not know, whose load then comes from kvgate's own accounting.
func ParseReport(body []byte) (r Report, ok bool) {
	b := bytes.TrimSpace(body)
	if len(b) > 0 && (b[0] == '[' || b[0] == '{') {
		return parseTRT(b)
	}
	r.KVUsage = -1
	var haveRun, haveWait bool
	for line := range samples(b) {
		name, val := line.name, line.val
		switch {
		case in(name, runningNames[:]):
			r.Running += int64(val)
			haveRun = true
		case in(name, waitingNames[:]):
			r.Waiting += int64(val)
			haveWait = true
		case in(name, kvUsageNames[:]):
			r.KVUsage = max(r.KVUsage, val)
		}
	}
	return r, haveRun || haveWait
}

// textSample is one sample line of a Prometheus text body.
type textSample struct {
	line, name []byte
	val        float64
}

// samples yields each well-formed sample line of a Prometheus text body (comments, blank
// and malformed lines are passed over).
func samples(b []byte) iter.Seq[textSample] {
	return func(yield func(textSample) bool) {
		for len(b) > 0 {
			line := b
			if nl := bytes.IndexByte(b, '\n'); nl >= 0 {
				line, b = b[:nl], b[nl+1:]
			} else {
				b = nil
			}
			line = bytes.TrimSpace(line)
			if len(line) == 0 || line[0] == '#' {
				continue
			}
			if name, val, ok := sample(line); ok && !yield(textSample{line: line, name: name, val: val}) {
				return
			}
		}
	}
}

// sample splits `name{labels} value [timestamp]`.
func sample(line []byte) (name []byte, v float64, ok bool) {
	end := bytes.IndexAny(line, "{ \t")
	if end <= 0 {
		return nil, 0, false
	}
	name = line[:end]
	rest := line[end:]
	if rest[0] == '{' {
		close := bytes.LastIndexByte(rest, '}')
		if close < 0 {
			return nil, 0, false
		}
		rest = rest[close+1:]
	}
	f := bytes.Fields(rest)
	if len(f) == 0 {
		return nil, 0, false
	}
	v, err := strconv.ParseFloat(string(f[0]), 64)
	if err != nil || v != v || v < 0 {
		return nil, 0, false
	}
	return name, v, true
}

func in(name []byte, names []string) bool {
	for _, n := range names {
		if string(name) == n {
			return true
		}
	}
	return false
}

// trtStats is the part of one TensorRT-LLM iteration-stats entry kvgate reads.
type trtStats struct {
	NumActiveRequests    *int64 `json:"numActiveRequests"`
	MaxNumActiveRequests int64  `json:"maxNumActiveRequests"`
	NumQueuedRequests    *int64 `json:"numQueuedRequests"`
	KVCacheStats         *struct {
		MaxNumBlocks  float64 `json:"maxNumBlocks"`
		UsedNumBlocks float64 `json:"usedNumBlocks"`
	} `json:"kvCacheStats"`
}

func parseTRT(b []byte) (r Report, ok bool) {
	var list []trtStats
	if b[0] == '{' {
		var one trtStats
		if json.Unmarshal(b, &one) != nil {
			return r, false
		}
		list = append(list, one)
	} else if json.Unmarshal(b, &list) != nil {
		return r, false
	}
	r.KVUsage = -1
	if len(list) == 0 {
		return r, true
	}
	last := list[len(list)-1]
	r.Slots = max(last.MaxNumActiveRequests, 0)
	if last.NumActiveRequests != nil {
		r.Running, ok = max(*last.NumActiveRequests, 0), true
	}
	if last.NumQueuedRequests != nil {
		r.Waiting, ok = max(*last.NumQueuedRequests, 0), true
	}
	if kv := last.KVCacheStats; kv != nil && kv.MaxNumBlocks > 0 {
		r.KVUsage = kv.UsedNumBlocks / kv.MaxNumBlocks
	}
	return r, ok
}

// ParseRankReports reads one report per data-parallel rank from an engine's Prometheus
// /metrics: vLLM's API server in front of n engine cores labels every scheduler gauge
// with its core's index (`engine="0"` ... `engine="n-1"`; docs/CONTRACTS.md,
// "Data-parallel ranks"). ok is false unless every rank in [0, n) has a running or
// waiting sample: a body without per-core labels (one engine, another engine kind, a
// proxy that sums them) says nothing about any single rank, and each rank's load then
// comes from kvgate's own accounting.
func ParseRankReports(body []byte, n int) (rs []Report, ok bool) {
	if n <= 0 {
		return nil, false
	}
	rs = make([]Report, n)
	seen := make([]bool, n)
	for i := range rs {
		rs[i].KVUsage = -1
	}
	b := bytes.TrimSpace(body)
	for smp := range samples(b) {
		name, val, line := smp.name, smp.val, smp.line
		run, wait, kv := in(name, runningNames[:]), in(name, waitingNames[:]), in(name, kvUsageNames[:])
		if !run && !wait && !kv {
			continue
		}
		r, isRank := engineLabel(line)
		if !isRank || r < 0 || r >= n {
			continue
		}
		switch {
		case run:
			rs[r].Running += int64(val)
			seen[r] = true
		case wait:
			rs[r].Waiting += int64(val)
			seen[r] = true
		default:
			rs[r].KVUsage = max(rs[r].KVUsage, val)
		}
	}
	for _, s := range seen {
		if !s {
			return nil, false
		}
	}
	return rs, true
}

// engineLabel reads the integer value of a sample's engine label.
func engineLabel(line []byte) (int, bool) {
	open := bytes.IndexByte(line, '{')
	close := bytes.LastIndexByte(line, '}')
	if open < 0 || close < open {
		return 0, false
	}
	labels := line[open+1 : close]
	for len(labels) > 0 {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return 0, false
		}
		key := bytes.TrimSpace(labels[:eq])
		rest := labels[eq+2:]
		end := bytes.IndexByte(rest, '"') // engine indexes and model names need no escapes
		if end < 0 {
			return 0, false
		}
		if string(key) == "engine" {
			v, err := strconv.Atoi(string(rest[:end]))
			return v, err == nil
		}
		labels = bytes.TrimLeft(rest[end+1:], ", ")
	}
	return 0, false
}
