package proxy

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cloudwego/hertz/pkg/protocol"

	"github.com/kvgate/kvgate/proxy/route"
)

// maxMetricsBody bounds one engine /metrics read: vLLM's is tens of kilobytes; a body
// past this is not what kvgate reads.
const maxMetricsBody = 4 << 20

// scrapeState is one endpoint's engine-load scrape, for /debug/inventory and /metrics.
type scrapeState struct {
	ok       atomic.Uint64
	failed   atomic.Uint64
	failing  atomic.Bool
	lastErr  atomic.Pointer[string]
	duration atomic.Int64 // last scrape, nanoseconds
	inFlight atomic.Bool
	// jsonOnly: a TensorRT-LLM endpoint without the Prometheus route (404); its JSON
	// /metrics is read instead.
	jsonOnly atomic.Bool
}

// scrapeBudget is how many /metrics reads kvgate makes per second at most. A read costs
// tens of microseconds of CPU and a connection's buffers, so at 1,000 a second the scrape
// stays within a few percent of a core at any fleet size: up to 50 endpoints each is read
// every -kv-load-scrape, past that the interval grows as one millisecond per endpoint
// (1,024 endpoints: about a second), and a report goes stale after three of them. With
// that many engines each one sees little of a replica's traffic between reads, and
// kvgate's own accounting of what it sent carries the load in between.
const scrapeBudget = 1000

// scrapeInterval is how often each of n endpoint slots is read when asked for every.
func scrapeInterval(every time.Duration, n int) time.Duration {
	return max(every, time.Duration(n)*time.Second/scrapeBudget)
}

// scrapeLoop reads every endpoint's /metrics once per s.scrapeEvery (route.ParseReport)
// into s.queues, one endpoint at a time spread evenly over the interval, so reads never
// come in a burst of the whole fleet. Nothing on the request path waits for it: a
// missing, slow or garbage /metrics only leaves that endpoint's report to go stale, and
// the cost policy and the decode choice fall back to kvgate's own accounting for it
// (counted, shown per endpoint on /debug/inventory, warned once per failing episode).
func (s *Server) scrapeLoop() {
	defer s.wg.Done()
	n := len(s.roster().eps) // the slot table's size: fixed for the server's life
	t := time.NewTicker(max(s.scrapeEvery/time.Duration(n), time.Microsecond))
	defer t.Stop()
	for next := 0; ; next = (next + 1) % n {
		// A slow engine's last scrape still running is skipped, not piled up.
		if e := s.roster().eps[next]; !e.vacant && !e.retired.Load() && e.scrape.inFlight.CompareAndSwap(false, true) {
			s.wg.Add(1)
			go func(i int) {
				defer s.wg.Done()
				s.scrapeOne(i, e)
			}(next)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) scrapeOne(i int, e *endpoint) {
	defer e.scrape.inFlight.Store(false)
	t0 := time.Now()
	r, ranks, err := s.readReport(e)
	e.scrape.duration.Store(int64(time.Since(t0)))
	if err != nil {
		e.scrape.failed.Add(1)
		msg := err.Error()
		e.scrape.lastErr.Store(&msg)
		if !e.scrape.failing.Swap(true) {
			s.log.Warn("engine /metrics unreadable: its load comes from kvgate's own accounting until it reads again",
				"endpoint", e.spec.Name, "err", msg)
		}
		return
	}
	e.scrape.ok.Add(1)
	if e.scrape.failing.Swap(false) {
		s.log.Info("engine /metrics readable again", "endpoint", e.spec.Name)
	}
	s.queues.Observe(i, r, s.loads.Get(i), time.Now())
	if s.kv != nil {
		s.kv.observeRanks(i, r, ranks)
	}
}

var errNoLoad = errors.New("no running or waiting request gauge in the body")

// readReport reads e's load; ranks is one report per data-parallel rank when e has
// several and its body labels each (route.ParseRankReports), else nil.
func (s *Server) readReport(e *endpoint) (r route.Report, ranks []route.Report, err error) {
	req := protocol.AcquireRequest()
	res := protocol.AcquireResponse()
	defer protocol.ReleaseRequest(req)
	defer protocol.ReleaseResponse(res)
	// trtllm-serve's /metrics is a JSON drain of iteration stats that two readers would
	// split; its Prometheus gauges (return_perf_metrics) are read when it serves them.
	trtProm := e.spec.Engine == EngineTRTLLM && !e.scrape.jsonOnly.Load()
	if trtProm {
		req.SetRequestURI(e.spec.URL + "/prometheus/metrics")
	} else {
		req.SetRequestURI(e.spec.URL + "/metrics")
	}
	req.Header.SetMethod("GET")
	timeout := s.scrapeEvery
	if t := s.cfg.Health.Timeout; t > 0 { // unchecked (maybe 0) while health checks are off
		timeout = min(timeout, t)
	}
	ctx, cancel := context.WithTimeout(s.ctx, timeout)
	defer cancel()
	if err := s.client.DoTimeout(ctx, req, res, timeout); err != nil {
		return route.Report{}, nil, err
	}
	defer res.CloseBodyStream() //nolint:errcheck
	if code := res.StatusCode(); trtProm && code == 404 {
		e.scrape.jsonOnly.Store(true)
		return route.Report{}, nil, errors.New("no /prometheus/metrics (return_perf_metrics off): reading the JSON /metrics from now on")
	} else if code != 200 {
		return route.Report{}, nil, errors.New("status " + strconv.Itoa(code))
	}
	body, err := io.ReadAll(io.LimitReader(res.BodyStream(), maxMetricsBody))
	if err != nil {
		return route.Report{}, nil, err
	}
	r, ok := route.ParseReport(body)
	if !ok {
		return route.Report{}, nil, errNoLoad
	}
	if e.spec.DP > 1 {
		ranks, _ = route.ParseRankReports(body, e.spec.DP)
	}
	return r, ranks, nil
}
