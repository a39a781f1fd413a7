package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loadResult counts a driven load's outcomes: lost are requests whose client saw an
// error status, a transport error or a stream not ending in [DONE].
type loadResult struct {
	ok, lost int64
	byEP     map[string]int
	errs     []string
}

// drive sends n requests with conc workers (every third one streamed) and checks each
// answer is a complete, well-formed engine answer.
func drive(t *testing.T, s *Server, n, conc int) loadResult {
	t.Helper()
	var ok, lost atomic.Int64
	var mu sync.Mutex
	r := loadResult{byEP: map[string]int{}}
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				stream := i%3 == 0
				body := fmt.Sprintf(`{"model":"m","prompt":"request %d","stream":%v}`, i, stream)
				res, err := httpc.Post(s.url("/v1/completions"), "application/json", strings.NewReader(body))
				var fail string
				if err != nil {
					fail = err.Error()
				} else {
					b, rerr := io.ReadAll(res.Body)
					res.Body.Close()
					switch {
					case rerr != nil:
						fail = "body: " + rerr.Error()
					case res.StatusCode != 200:
						fail = fmt.Sprintf("status %d %.120s", res.StatusCode, b)
					case stream && !strings.HasSuffix(string(b), "data: [DONE]\n\n"):
						fail = fmt.Sprintf("stream cut: %.120q", b)
					case !stream && !strings.Contains(string(b), `"usage"`):
						fail = fmt.Sprintf("body %.120q", b)
					}
					mu.Lock()
					r.byEP[res.Header.Get("x-kvgate-endpoint")]++
					mu.Unlock()
				}
				if fail != "" {
					lost.Add(1)
					mu.Lock()
					if len(r.errs) < 5 {
						r.errs = append(r.errs, fail)
					}
					mu.Unlock()
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	r.ok, r.lost = ok.Load(), lost.Load()
	return r
}

// TestFaultRefusingBackend: one of three endpoints refuses connections under concurrent
// load: every request is served by the others (0 lost), the breaker opens.
func TestFaultRefusingBackend(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	cfg := testConfig("http://"+deadAddr(t), a.url(), b.url())
	cfg.Breaker.Failures = 3
	cfg.Breaker.OpenFor = time.Minute
	s := startProxy(t, cfg)
	r := drive(t, s, 300, 8)
	if r.lost != 0 {
		t.Fatalf("lost %d of 300 with healthy endpoints: %v", r.lost, r.errs)
	}
	if st := s.roster().eps[0].breaker.State(); st != BreakerOpen {
		t.Errorf("breaker %v, want open", st)
	}
	if r.byEP["e0"] != 0 || r.byEP["e1"] == 0 || r.byEP["e2"] == 0 {
		t.Errorf("served by %v", r.byEP)
	}
	if n := s.m.retries.Get(); n == 0 {
		t.Error("no retries counted")
	}
	t.Logf("refusing backend: %d ok, %d lost, %d connect failures, %d retries", r.ok, r.lost, s.m.upstream[ErrConnect][0].Get(), s.m.retries.Get())
}

// hungListener accepts connections and reads requests but never answers.
func hungListener(t *testing.T) (addr string, conns *atomic.Int32) {
	ln := listenLocal(t)
	conns = new(atomic.Int32)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				io.Copy(io.Discard, c) // until kvgate gives up and closes
				c.Close()
				conns.Add(-1)
			}()
		}
	}()
	return ln.Addr().String(), conns
}

// TestFaultHangingBackend: an engine that accepts and never answers. With health checks
// it is excluded before requests land on it (0 lost). Without them, requests it accepted
// get 504 after -upstream-timeout (an engine that took a request may be working on it:
// kvgate does not replay it) until the breaker opens; then 0 lost. kvgate closes the
// hung connections.
func TestFaultHangingBackend(t *testing.T) {
	t.Run("health checks", func(t *testing.T) {
		hung, _ := hungListener(t)
		a := newFakeEngine(t, "a")
		cfg := testConfig("http://"+hung, a.url())
		cfg.Health.Interval = 50 * time.Millisecond
		// Generous next to the healthy engine's answers even on a loaded -race run, so
		// only the hung endpoint ever fails a probe or a request.
		cfg.Health.Timeout = 500 * time.Millisecond
		cfg.Upstream.Timeout = 3 * time.Second
		s := startProxy(t, cfg)
		waitFor(t, "hung endpoint unhealthy", func() bool { return s.roster().eps[0].checked.Load() && !s.roster().eps[0].healthy.Load() })
		if r := drive(t, s, 100, 4); r.lost != 0 {
			t.Fatalf("lost %d: %v", r.lost, r.errs)
		}
	})
	t.Run("breaker only", func(t *testing.T) {
		hung, conns := hungListener(t)
		a := newFakeEngine(t, "a")
		cfg := testConfig("http://"+hung, a.url())
		cfg.Upstream.Timeout = time.Second // the healthy engine answers far inside it
		cfg.Breaker.Failures = 2
		cfg.Breaker.OpenFor = time.Minute
		s := startProxy(t, cfg)
		timeouts := 0
		for i := 0; i < 20; i++ {
			res, body := post(t, s.url("/v1/completions"), complBody)
			switch res.StatusCode {
			case 200:
			case 504:
				timeouts++
				checkErrorBody(t, body, 504)
			default:
				t.Fatalf("status %d %s", res.StatusCode, body)
			}
		}
		if timeouts != 2 || s.roster().eps[0].breaker.State() != BreakerOpen {
			t.Errorf("%d timeouts (want 2 = -breaker-failures), breaker %v", timeouts, s.roster().eps[0].breaker.State())
		}
		waitFor(t, "hung connections closed by kvgate", func() bool { return conns.Load() == 0 })
		if r := drive(t, s, 60, 4); r.lost != 0 {
			t.Fatalf("after the breaker opened: lost %d: %v", r.lost, r.errs)
		}
	})
}

// TestFault5xxStreak: an engine answering 500 to everything. Its answers are retried on
// another endpoint while nothing reached the client (0 lost); the 5xx streak opens its
// breaker. With no alternative left, the engine's own 5xx answer is relayed.
func TestFault5xxStreak(t *testing.T) {
	bad, good := newFakeEngine(t, "bad"), newFakeEngine(t, "good")
	bad.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(500)
		io.WriteString(w, `{"error":{"message":"engine fell over","code":500}}`)
		return true
	}
	cfg := testConfig(bad.url(), good.url())
	cfg.Breaker.Streak5xx = 3
	cfg.Breaker.OpenFor = time.Minute
	s := startProxy(t, cfg)
	r := drive(t, s, 200, 4)
	if r.lost != 0 {
		t.Fatalf("lost %d: %v", r.lost, r.errs)
	}
	if st := s.roster().eps[0].breaker.State(); st != BreakerOpen {
		t.Errorf("breaker %v, want open after a 5xx streak", st)
	}
	if n := s.m.upstream[Err5xx][0].Get(); n < 3 {
		t.Errorf("5xx counted %d", n)
	}
	// Only the failing engine: its answer reaches the client unchanged.
	s1 := startProxy(t, testConfig(bad.url()))
	res, body := post(t, s1.url("/v1/completions"), complBody)
	if res.StatusCode != 500 || !strings.Contains(body, "engine fell over") {
		t.Errorf("last endpoint's 5xx: %d %s", res.StatusCode, body)
	}
}

// TestFaultTruncatedBodyRetried: an engine that cuts its non-streamed answer short: nothing
// reached the client, so another endpoint serves it (0 lost).
func TestFaultTruncatedBodyRetried(t *testing.T) {
	cut := rawEngine(t, truncatingEngine)
	good := newFakeEngine(t, "good")
	cfg := testConfig(cut, good.url())
	cfg.Breaker.OpenFor = time.Minute
	s := startProxy(t, cfg)
	for i := 0; i < 20; i++ {
		res, body := post(t, s.url("/v1/completions"), complBody)
		if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != "e1" {
			t.Fatalf("request %d: %d %s %s", i, res.StatusCode, res.Header.Get("x-kvgate-endpoint"), body)
		}
	}
	if n := s.m.upstream[ErrMidStream][0].Get() + s.m.upstream[ErrConnect][0].Get(); n == 0 {
		t.Error("truncated answers not counted")
	}
}

// TestFaultClientDisconnectStorm: many clients leave mid-stream at different points:
// every engine request is cancelled, in-flight counts return to 0, no goroutine is left.
func TestFaultClientDisconnectStorm(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	var active, started, cancelled atomic.Int32
	h := func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		started.Add(1)
		active.Add(1)
		defer active.Add(-1)
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			if _, err := io.WriteString(w, "data: {\"x\":1}\n\n"); err != nil {
				cancelled.Add(1)
				return true
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				cancelled.Add(1)
				return true
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	a.handle, b.handle = h, h
	s := startProxy(t, testConfig(a.url(), b.url()))
	httpc.CloseIdleConnections()
	base := runtime.NumGoroutine()
	const n = 40
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			conn, err := net.Dial("tcp", s.PublicAddr())
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			body := `{"model":"m","prompt":"x","stream":true}`
			io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
			br := bufio.NewReader(conn)
			for j := 0; j < i%7; j++ { // leave after 0..6 lines
				if _, err := br.ReadString('\n'); err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
			}
		}(i)
	}
	wg.Wait()
	// A client that left before kvgate read its request never reaches an engine.
	waitFor(t, "every engine request cancelled", func() bool {
		return active.Load() == 0 && cancelled.Load() == started.Load() && started.Load() >= n/2
	})
	waitFor(t, "in-flight released", func() bool { return s.loads.Get(0) == 0 && s.loads.Get(1) == 0 })
	waitFor(t, "client disconnects counted", func() bool { return s.m.clientGone.Get() >= uint64(started.Load()) })
	s.client.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base+5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > base+5 {
		t.Errorf("goroutines %d -> %d after %d aborted streams", base, g, n)
	}
}

// TestFaultSlowSSEReader: a client that stops reading a fast 64 MiB stream. kvgate holds
// one 8 KiB relay buffer per stream: the engine's writes block (backpressure), heap stays
// flat, and when the client resumes it gets every byte in order.
func TestFaultSlowSSEReader(t *testing.T) {
	const event = "data: " + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde" + "\n\n" // 72 bytes
	const total = 64 << 20
	var written atomic.Int64
	a := newFakeEngine(t, "a")
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := strings.Repeat(event, 4096/len(event)*8) // ~32 KiB
		for written.Load() < total {
			n, err := io.WriteString(w, chunk)
			written.Add(int64(n))
			if err != nil {
				return true
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return true
	}
	s := startProxy(t, testConfig(a.url()))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap0 := ms.HeapInuse
	conn, err := net.Dial("tcp", s.PublicAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m","prompt":"x","stream":true}`
	io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "+itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
	// Do not read: wait until the engine is blocked (its byte count stops moving).
	var last int64 = -1
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(200 * time.Millisecond)
		w := written.Load()
		if w == last && w > 0 {
			break
		}
		last = w
		if time.Now().After(deadline) {
			t.Fatalf("engine never blocked: %d bytes written with a stalled client", w)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	// In flight: socket buffers on three hops (kernel memory, not heap) and one relay
	// buffer; the engine is stopped far short of the stream's end.
	if w := written.Load(); w >= total {
		t.Errorf("engine wrote %d MiB before blocking: no backpressure", w>>20)
	}
	if grown := int64(ms.HeapInuse) - int64(heap0); grown > 16<<20 {
		t.Errorf("heap grew %d MiB while the client stalled", grown>>20)
	}
	t.Logf("stalled client: engine blocked after %d KiB; heap %+d KiB", written.Load()>>10, (int64(ms.HeapInuse)-int64(heap0))>>10)
	// Resume: every byte arrives, in order.
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReaderSize(res.Body, 64<<10)
	var got int64
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d bytes: %v", got, err)
		}
		got += int64(len(line))
		if line == "data: [DONE]\n" {
			break
		}
		if line != "\n" && line != event[:len(event)-1] {
			t.Fatalf("corrupted line at %d: %q", got, line)
		}
	}
	if got < total {
		t.Errorf("got %d bytes, want >= %d", got, total)
	}
}

// TestLongStreamOutlivesUpstreamTimeout: -upstream-timeout bounds the wait between reads,
// not a stream's length: a 1.8 s stream with an event every 60 ms passes a 1 s timeout.
func TestLongStreamOutlivesUpstreamTimeout(t *testing.T) {
	a := newFakeEngine(t, "a")
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 30; i++ {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(60 * time.Millisecond)
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return true
	}
	cfg := testConfig(a.url())
	// 30 gaps of 60 ms (1.8 s in all) under a 1 s timeout: each gap is far inside it
	// even on a loaded machine under -race, the whole stream is not.
	cfg.Upstream.Timeout = time.Second
	s := startProxy(t, cfg)
	res, body := post(t, s.url("/v1/completions"), `{"model":"m","prompt":"x","stream":true}`)
	if res.StatusCode != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") || strings.Count(body, "data: {") != 30 {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
}
