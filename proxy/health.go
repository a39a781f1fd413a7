package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/cloudwego/hertz/pkg/protocol"
)

// healthLoop probes every endpoint's health path each interval, concurrently, so a
// dead endpoint leaves the eligible set before a request fails on it.
func (s *Server) healthLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Health.Interval)
	defer t.Stop()
	for {
		s.checkAll()
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) checkAll() {
	var wg sync.WaitGroup
	for _, e := range s.roster().eps {
		if e.retired.Load() {
			continue
		}
		wg.Add(1)
		go func(e *endpoint) {
			defer wg.Done()
			s.checkOne(e)
		}(e)
	}
	wg.Wait()
}

// checkOne probes e once and records the answer (an endpoint added at runtime is checked
// at once: it takes requests only after its first check passes).
func (s *Server) checkOne(e *endpoint) {
	ok := s.probe(e)
	was := e.healthy.Swap(ok)
	e.checked.Store(true)
	if was != ok && !e.retired.Load() {
		s.log.Warn("endpoint health changed", "endpoint", e.spec.Name, "healthy", ok)
	}
	if ok && !was && s.kv != nil && !e.retired.Load() {
		// The engine is back: follow its events now, not after the
		// subscriber's backoff (up to 30 s of routing on a stale inventory).
		s.kv.mgr.Redial(e.idx)
	}
}

func (s *Server) probe(e *endpoint) bool {
	req := protocol.AcquireRequest()
	res := protocol.AcquireResponse()
	defer protocol.ReleaseRequest(req)
	defer protocol.ReleaseResponse(res)
	req.SetRequestURI(e.spec.URL + s.cfg.Health.Path)
	req.Header.SetMethod("GET")
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Health.Timeout)
	defer cancel()
	err := s.client.DoTimeout(ctx, req, res, s.cfg.Health.Timeout)
	if err != nil {
		return false
	}
	res.CloseBodyStream() //nolint:errcheck
	return res.StatusCode() >= 200 && res.StatusCode() < 300
}
