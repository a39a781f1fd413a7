package proxy

import (
	"strconv"

	"github.com/VictoriaMetrics/metrics"
)

// Route is one routing decision kind; its label is what x-kvgate-route says.
type Route uint8

const (
	RouteRR Route = iota
	RouteCHWBL
	RouteKVHit
	RouteMissTextEmpty
	RouteMissModelUnknown
	RouteMissTokenize
	RouteMissNoBlocks
	RouteMissNoWorker
	RouteMissShallow
	RouteMissTooLong // prompt text over -kv-max-prompt-bytes: not tokenized
	RouteAffinity
	RoutePDLoad
	RoutePrefixTrie // mode 1: the prefill endpoint kvgate sent the longest run of the prompt (trie.go)
	// RouteKVSpread: the cost policy placed the request away from every holder of its
	// prefix, whose queue costs more than the prefill it would save.
	RouteKVSpread
	// RouteMissRequestTemplate: the request brings its own chat template (fields.go).
	RouteMissRequestTemplate
	// RouteMissMedia: the prompt holds media and what lies before its first media item
	// fills no block, or the cut before it cannot be placed (fields.go).
	RouteMissMedia
	// RouteMissResponses: a Responses API body kvgate cannot key exactly (server-side
	// history, tools, non-message items; fields.go).
	RouteMissResponses
	// RouteMissTruncated: the engine cuts the prompt (truncate_prompt_tokens; fields.go).
	RouteMissTruncated
	// RouteMissEngineFields: a chat field the pool's SGLang endpoints render differently
	// from vLLM (fields.go).
	RouteMissEngineFields
	numRoutes
)

var routeLabels = [numRoutes]string{
	RouteRR: "rr", RouteCHWBL: "chwbl", RouteKVHit: "kv-hit",
	RouteMissTextEmpty: "kv-miss:text_empty", RouteMissModelUnknown: "kv-miss:model_unknown",
	RouteMissTokenize: "kv-miss:tokenize", RouteMissNoBlocks: "kv-miss:no_blocks",
	RouteMissNoWorker: "kv-miss:no_worker", RouteMissShallow: "kv-miss:shallow",
	RouteMissTooLong: "kv-miss:too_long",
	RouteAffinity:    "affinity", RoutePDLoad: "pd-load", RoutePrefixTrie: "prefix-trie",
	RouteKVSpread:            "kv-spread",
	RouteMissRequestTemplate: "kv-miss:request_template", RouteMissMedia: "kv-miss:media",
	RouteMissResponses: "kv-miss:responses", RouteMissTruncated: "kv-miss:truncated",
	RouteMissEngineFields: "kv-miss:engine_fields",
}

func (r Route) String() string { return routeLabels[r] }

// IsMiss says r is a KV-Exact miss that fell back to the rule's selector.
func (r Route) IsMiss() bool {
	return r >= RouteMissTextEmpty && r <= RouteMissTooLong || r >= RouteMissRequestTemplate && r <= RouteMissEngineFields
}

// Stage is one step of the request path timed by kvgate_route_stage_seconds.
type Stage uint8

const (
	StageParse    Stage = iota
	StageTokenize       // template + tokenizer
	StageHash
	StageScore
	StageSelect
	numStages
)

var stageNames = [numStages]string{"parse", "tokenize", "hash", "score", "select"}

// BadInput is a reason a request was refused before any engine saw it.
type BadInput uint8

const (
	BadJSON BadInput = iota
	BadTooLarge
	BadReadBody
	BadFraming // Content-Length with Transfer-Encoding, or an unknown transfer coding
	BadTarget  // a request target hertz cannot parse
	// Requests hertz refuses itself before any handler (answered as JSON by headConn):
	BadHeaderTooLarge // request head over -max-header-bytes
	BadHead           // a request head hertz cannot parse (e.g. a malformed Content-Length)
	BadTimeout        // the request was not received within the read timeout
	numBadInputs
)

var badNames = [numBadInputs]string{"malformed_json", "too_large", "read_body", "framing", "request_target",
	"header_too_large", "malformed_head", "read_timeout"}

// UpstreamError is a failure kind when talking to an endpoint.
type UpstreamError uint8

const (
	ErrConnect UpstreamError = iota
	ErrTimeout
	Err5xx
	ErrMidStream
	numUpstreamErrors
)

var upstreamErrNames = [numUpstreamErrors]string{"connect", "timeout", "5xx", "mid_stream"}

// proxyMetrics pre-creates every series so the request path only bumps counters.
type proxyMetrics struct {
	set        *metrics.Set
	routed     [numRoutes][]*metrics.Counter // {endpoint, route}
	hits       []*metrics.Counter
	predicted  []*metrics.Counter // predicted cached tokens on hits
	delivered  []*metrics.Counter // engine-reported cached tokens
	receipts   []*metrics.Counter // responses that carried usage.prompt_tokens_details
	promptToks []*metrics.Counter
	upstream   [numUpstreamErrors][]*metrics.Counter
	misses     [numRoutes]*metrics.Counter
	bad        [numBadInputs]*metrics.Counter
	stage      [numStages]*metrics.Histogram
	route      *metrics.Histogram // steps 1-5 of the request path, first decision
	nextBest   *metrics.Counter
	retries    *metrics.Counter
	noHealthy  *metrics.Counter
	unknownMdl *metrics.Counter
	affinity   *metrics.Counter
	clientGone *metrics.Counter
}

func newProxyMetrics(names []string) *proxyMetrics {
	s := metrics.NewSet()
	m := &proxyMetrics{set: s}
	n := len(names)
	per := func(name, extra string) []*metrics.Counter {
		out := make([]*metrics.Counter, n)
		for i, ep := range names {
			out[i] = s.NewCounter(name + `{endpoint=` + strconv.Quote(ep) + extra + `}`)
		}
		return out
	}
	for r := Route(0); r < numRoutes; r++ {
		m.routed[r] = per("kvgate_requests_total", `,route=`+strconv.Quote(r.String()))
		if r.IsMiss() {
			m.misses[r] = s.NewCounter(`kvgate_kv_misses_total{reason=` + strconv.Quote(r.String()[len("kv-miss:"):]) + `}`)
		}
	}
	m.hits = per("kvgate_kv_hits_total", "")
	m.predicted = per("kvgate_predicted_cached_tokens_total", "")
	m.delivered = per("kvgate_delivered_cached_tokens_total", "")
	m.receipts = per("kvgate_delivery_receipts_total", "")
	m.promptToks = per("kvgate_delivered_prompt_tokens_total", "")
	for k := UpstreamError(0); k < numUpstreamErrors; k++ {
		m.upstream[k] = per("kvgate_upstream_errors_total", `,kind=`+strconv.Quote(upstreamErrNames[k]))
	}
	for b := BadInput(0); b < numBadInputs; b++ {
		m.bad[b] = s.NewCounter(`kvgate_bad_requests_total{reason=` + strconv.Quote(badNames[b]) + `}`)
	}
	for st := Stage(0); st < numStages; st++ {
		m.stage[st] = s.NewHistogram(`kvgate_route_stage_seconds{stage=` + strconv.Quote(stageNames[st]) + `}`)
	}
	m.route = s.NewHistogram("kvgate_route_seconds")
	m.nextBest = s.NewCounter("kvgate_kv_next_best_total")
	m.retries = s.NewCounter("kvgate_retries_total")
	m.noHealthy = s.NewCounter("kvgate_no_healthy_endpoint_total")
	m.unknownMdl = s.NewCounter("kvgate_unknown_model_total")
	m.affinity = s.NewCounter("kvgate_session_affinity_hits_total")
	m.clientGone = s.NewCounter("kvgate_client_disconnects_total")
	return m
}
