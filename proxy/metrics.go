package proxy

import (
	"strconv"
	"sync/atomic"
	"time"

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
	routed     [numRoutes][]slotCounter // {endpoint, route}
	hits       []slotCounter
	predicted  []slotCounter // predicted cached tokens on hits
	delivered  []slotCounter // engine-reported cached tokens
	receipts   []slotCounter // responses that carried usage.prompt_tokens_details
	promptToks []slotCounter
	upstream   [numUpstreamErrors][]slotCounter
	misses     [numRoutes]*metrics.Counter
	bad        [numBadInputs]*metrics.Counter
	stage      [numStages]*metrics.PrometheusHistogram
	route      *metrics.PrometheusHistogram // steps 1-5 of the request path, first decision
	nextBest   *metrics.Counter
	retries    *metrics.Counter
	noHealthy  *metrics.Counter
	unknownMdl *metrics.Counter
	affinity   *metrics.Counter
	clientGone *metrics.Counter
	// unauthorized: public requests refused 401 for a missing or unknown API key.
	unauthorized *metrics.Counter

	names []atomic.Pointer[string] // each slot's endpoint name (relabel)
	// answered is created on first use per {route, endpoint}: with 1024 endpoints the
	// full cross product of histograms would be most of /metrics and never seen.
	answered [numRoutes][]atomic.Pointer[answerSeries]
}

// answerSeries are the series of one {endpoint, route}: duration, time to first
// response byte, and answers by status code.
type answerSeries struct {
	dur, ttft *metrics.PrometheusHistogram
	codes     [numCodes]atomic.Pointer[metrics.Counter]
	labels    string
}

// Buckets: the routing overhead is microseconds to a few milliseconds; requests and
// TTFT are milliseconds to minutes (long generations).
var (
	routeBuckets = []float64{5e-6, 1e-5, 2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 7.5e-4,
		1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2.5e-2, 0.1}
	requestBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// statusCodes are the codes kept as their own label value; others count by class.
var statusCodes = [...]int{200, 400, 401, 403, 404, 408, 413, 422, 429, 500, 502, 503, 504}

const numCodes = len(statusCodes) + 5 // + 1xx..5xx classes

func codeIndex(status int) int {
	for i, c := range statusCodes {
		if c == status {
			return i
		}
	}
	cls := status/100 - 1
	if cls < 0 || cls > 4 {
		cls = 4
	}
	return len(statusCodes) + cls
}

func codeLabel(i int) string {
	if i < len(statusCodes) {
		return strconv.Itoa(statusCodes[i])
	}
	return strconv.Itoa(i-len(statusCodes)+1) + "xx"
}

// observeRequest records one answered request: the only entry point for the request
// duration, TTFT and status-code families (forward.go calls it once per answer). ttft
// is the time to the first response body byte; 0 when no body byte was sent.
func (m *proxyMetrics) observeRequest(ep int, route Route, status int, dur, ttft time.Duration) {
	if ep < 0 || ep >= len(m.names) || route >= numRoutes {
		return
	}
	a := m.answered[route][ep].Load()
	if a == nil {
		a = m.newAnswerSeries(ep, route)
	}
	a.dur.Update(dur.Seconds())
	if ttft > 0 {
		a.ttft.Update(ttft.Seconds())
	}
	ci := codeIndex(status)
	c := a.codes[ci].Load()
	if c == nil {
		c = m.set.GetOrCreateCounter(`kvgate_responses_total{` + a.labels + `,code="` + codeLabel(ci) + `"}`)
		a.codes[ci].Store(c)
	}
	c.Inc()
}

func (m *proxyMetrics) newAnswerSeries(ep int, route Route) *answerSeries {
	lbl := `endpoint=` + strconv.Quote(m.name(ep)) + `,route=` + strconv.Quote(route.String())
	a := &answerSeries{labels: lbl,
		dur:  m.set.GetOrCreatePrometheusHistogramExt(`kvgate_request_duration_seconds{`+lbl+`}`, requestBuckets),
		ttft: m.set.GetOrCreatePrometheusHistogramExt(`kvgate_ttft_seconds{`+lbl+`}`, requestBuckets),
	}
	if m.answered[route][ep].CompareAndSwap(nil, a) {
		return a
	}
	return m.answered[route][ep].Load() // another request made it first (same series)
}

// newProxyMetrics creates the series; names has one entry per slot, "" for a vacant
// one (its series come with the endpoint that takes it: relabel).
func newProxyMetrics(names []string) *proxyMetrics {
	s := metrics.NewSet()
	n := len(names)
	m := &proxyMetrics{set: s, names: make([]atomic.Pointer[string], n)}
	for r := range m.answered {
		m.answered[r] = make([]atomic.Pointer[answerSeries], n)
	}
	for r := Route(0); r < numRoutes; r++ {
		m.routed[r] = make([]slotCounter, n)
		if r.IsMiss() {
			m.misses[r] = s.NewCounter(`kvgate_kv_misses_total{reason=` + strconv.Quote(r.String()[len("kv-miss:"):]) + `}`)
		}
	}
	m.hits, m.predicted, m.delivered = make([]slotCounter, n), make([]slotCounter, n), make([]slotCounter, n)
	m.receipts, m.promptToks = make([]slotCounter, n), make([]slotCounter, n)
	for k := range m.upstream {
		m.upstream[k] = make([]slotCounter, n)
	}
	for i, name := range names {
		if name != "" {
			m.relabel(i, name)
		}
	}
	for b := BadInput(0); b < numBadInputs; b++ {
		m.bad[b] = s.NewCounter(`kvgate_bad_requests_total{reason=` + strconv.Quote(badNames[b]) + `}`)
	}
	for st := Stage(0); st < numStages; st++ {
		m.stage[st] = s.NewPrometheusHistogramExt(`kvgate_route_stage_seconds{stage=`+strconv.Quote(stageNames[st])+`}`, routeBuckets)
	}
	m.route = s.NewPrometheusHistogramExt("kvgate_route_seconds", routeBuckets)
	m.nextBest = s.NewCounter("kvgate_kv_next_best_total")
	m.retries = s.NewCounter("kvgate_retries_total")
	m.noHealthy = s.NewCounter("kvgate_no_healthy_endpoint_total")
	m.unknownMdl = s.NewCounter("kvgate_unknown_model_total")
	m.affinity = s.NewCounter("kvgate_session_affinity_hits_total")
	m.clientGone = s.NewCounter("kvgate_client_disconnects_total")
	m.unauthorized = s.NewCounter("kvgate_unauthorized_total")
	return m
}

// slotCounter is one slot's counter of a per-endpoint family. The slot's endpoint can
// change (relabel), so the counter is read through an atomic pointer: a reader holding
// an older fleet snapshot sees the old endpoint's counter or the new one, never a torn
// write. Inc, Add and Get keep the call sites those of a *metrics.Counter; a vacant
// slot's counter is nil and counts nothing.
type slotCounter struct {
	p atomic.Pointer[metrics.Counter]
}

func (c *slotCounter) Inc() {
	if m := c.p.Load(); m != nil {
		m.Inc()
	}
}

func (c *slotCounter) Add(n int) {
	if m := c.p.Load(); m != nil {
		m.Add(n)
	}
}

func (c *slotCounter) Get() uint64 {
	if m := c.p.Load(); m != nil {
		return m.Get()
	}
	return 0
}

// name is slot ep's endpoint name ("" while vacant).
func (m *proxyMetrics) name(ep int) string {
	if p := m.names[ep].Load(); p != nil {
		return *p
	}
	return ""
}

// slotSeries are the per-endpoint series names of slot i under name, in the order
// relabel fills them.
func slotSeries(name string) []string {
	ep := `endpoint=` + strconv.Quote(name)
	out := make([]string, 0, int(numRoutes)+5+int(numUpstreamErrors))
	for r := Route(0); r < numRoutes; r++ {
		out = append(out, `kvgate_requests_total{`+ep+`,route=`+strconv.Quote(r.String())+`}`)
	}
	for _, f := range [...]string{"kvgate_kv_hits_total", "kvgate_predicted_cached_tokens_total",
		"kvgate_delivered_cached_tokens_total", "kvgate_delivery_receipts_total", "kvgate_delivered_prompt_tokens_total"} {
		out = append(out, f+`{`+ep+`}`)
	}
	for k := UpstreamError(0); k < numUpstreamErrors; k++ {
		out = append(out, `kvgate_upstream_errors_total{`+ep+`,kind=`+strconv.Quote(upstreamErrNames[k])+`}`)
	}
	return out
}

// relabel gives slot i the series of the endpoint named name. The fleet calls it on a
// vacant slot before publishing the roster that puts the endpoint there, so every
// request that can pick slot i sees these counters (the roster's atomic swap orders
// them). A name already counted (a changed endpoint, re-added under its name while its
// old slot drains) continues its series.
func (m *proxyMetrics) relabel(i int, name string) {
	names := slotSeries(name)
	c := func(sc *slotCounter, j int) { sc.p.Store(m.set.GetOrCreateCounter(names[j])) }
	for r := Route(0); r < numRoutes; r++ {
		c(&m.routed[r][i], int(r))
	}
	o := int(numRoutes)
	for j, sc := range [...]*slotCounter{&m.hits[i], &m.predicted[i], &m.delivered[i], &m.receipts[i], &m.promptToks[i]} {
		c(sc, o+j)
	}
	for k := UpstreamError(0); k < numUpstreamErrors; k++ {
		c(&m.upstream[k][i], o+5+int(k))
	}
	for r := range m.answered {
		m.answered[r][i].Store(nil)
	}
	m.names[i].Store(&name)
}

// unregister drops the series of an endpoint that left the fleet (no slot holds its
// name any more), so DNS churn cannot grow /metrics without bound.
func (m *proxyMetrics) unregister(i int, name string) {
	for _, s := range slotSeries(name) {
		m.set.UnregisterMetric(s)
	}
	for r := range m.answered {
		a := m.answered[r][i].Load()
		if a == nil {
			continue
		}
		m.set.UnregisterMetric(`kvgate_request_duration_seconds{` + a.labels + `}`)
		m.set.UnregisterMetric(`kvgate_ttft_seconds{` + a.labels + `}`)
		for ci := range a.codes {
			m.set.UnregisterMetric(`kvgate_responses_total{` + a.labels + `,code="` + codeLabel(ci) + `"}`)
		}
	}
}
