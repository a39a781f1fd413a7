package route

import (
	"bytes"
	"encoding/json"
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
		name, val, good := sample(line)
		if !good {
			continue
		}
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
