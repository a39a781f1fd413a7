package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// soakEngine is a fake engine that records nothing (the soak measures kvgate's memory,
// not the test's): non-streamed answers with usage, short SSE streams, and streams held
// open until release closes (idle streams).
func soakEngine(t *testing.T, release chan struct{}) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(body), `"idle"`):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"first\":1}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			io.WriteString(w, "data: [DONE]\n\n")
		case strings.Contains(string(body), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ev := range sseEvents("s") {
				io.WriteString(w, ev)
				w.(http.Flusher).Flush()
			}
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`)
		}
	}))
	srv.Config.SetKeepAlivesEnabled(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// rss is the process's resident set size (0 where /proc is missing).
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("KVGATE_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("KVGATE_SOAK=%q: %v", v, err)
		}
		return d
	}
	return 3 * time.Second // the short soak inside make test
}

// TestSoak: sustained load at saturation through kvgate to three engines on 127.0.0.1
// (32 workers on 2 cores, a third of requests streamed). After warm-up the goroutine
// count stays flat and the heap does not grow; no request fails. Then idle streams held
// open: memory and goroutines per stream are reported (make soak: 10k, as many as the
// file-descriptor limit allows; go test: 200).
func TestSoak(t *testing.T) {
	dur := soakDuration(t)
	release := make(chan struct{})
	var engines []string
	for i := 0; i < 3; i++ {
		engines = append(engines, soakEngine(t, release).URL)
	}
	cfg := testConfig(engines...)
	cfg.Upstream.Timeout = time.Minute
	s := startProxy(t, cfg)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}, Timeout: time.Minute}
	defer client.CloseIdleConnections()

	var sent, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const workers = 32
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				stream := (i+w)%3 == 0
				body := fmt.Sprintf(`{"model":"m","prompt":"soak %d %d","stream":%v}`, w, i, stream)
				res, err := client.Post(s.url("/v1/completions"), "application/json", strings.NewReader(body))
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					continue
				}
				b, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil || res.StatusCode != 200 || (stream && !strings.HasSuffix(string(b), "data: [DONE]\n\n")) {
					failed.Add(1)
				}
			}
		}(w)
	}
	warm := dur / 4
	time.Sleep(warm)
	g0, h0, r0 := runtime.NumGoroutine(), heapInuse(), rss()
	gMin, gMax := g0, g0
	rMax := r0
	var hMax uint64 = h0
	samples := 0
	deadline := time.Now().Add(dur - warm)
	for time.Now().Before(deadline) {
		time.Sleep(min(time.Until(deadline), dur/20+time.Millisecond))
		g, h := runtime.NumGoroutine(), heapInuse()
		gMin, gMax, hMax, rMax = min(gMin, g), max(gMax, g), max(hMax, h), max(rMax, rss())
		samples++
	}
	close(stop)
	wg.Wait()
	n, f := sent.Load(), failed.Load()
	t.Logf("soak %v: %d requests (%.0f/s), %d failed; goroutines after warm-up %d..%d; heap after warm-up %d KiB, max %d KiB; RSS %d MiB, max %d MiB (%d samples)",
		dur, n, float64(n)/dur.Seconds(), f, gMin, gMax, h0>>10, hMax>>10, r0>>20, rMax>>20, samples)
	if f != 0 {
		t.Errorf("%d of %d requests failed under load", f, n)
	}
	// Flat: workers' requests in flight account for a few goroutines each (client
	// transport, kvgate handler, engine handler); a leak grows with the request count.
	if gMax-gMin > 4*workers+20 {
		t.Errorf("goroutines not flat after warm-up: %d..%d", gMin, gMax)
	}
	if rMax > r0+64<<20 {
		t.Errorf("RSS grew from %d MiB to %d MiB after warm-up", r0>>20, rMax>>20)
	}
	if hMax > h0+32<<20 {
		t.Errorf("heap grew from %d KiB to %d KiB after warm-up", h0>>10, hMax>>10)
	}
	client.CloseIdleConnections()
	s.client.CloseIdleConnections()

	// Idle streams: first straight to an engine, then the same number through kvgate;
	// the difference is kvgate's cost per stream.
	streams := idleStreamCount(t)
	directRelease := make(chan struct{})
	direct := soakEngine(t, directRelease)
	gBase := runtime.NumGoroutine()
	dh, dg := holdIdleStreams(t, strings.TrimPrefix(direct.URL, "http://"), streams, func() bool { return true }, directRelease)
	waitFor(t, "direct streams gone", func() bool { return runtime.NumGoroutine() <= gBase+5 })
	vh, vg := holdIdleStreams(t, s.PublicAddr(), streams, func() bool {
		var in int64
		for i := range s.roster().eps {
			in += s.loads.Get(i)
		}
		return in == int64(streams)
	}, release)
	t.Logf("idle streams: %d open; straight to the engine %.1f KiB and %.2f goroutines per stream; through kvgate %.1f KiB and %.2f goroutines; kvgate's share %.1f KiB and %.2f goroutines per stream",
		streams, dh/1024, dg, vh/1024, vg, (vh-dh)/1024, vg-dg)
	if vh-dh > 128<<10 {
		t.Errorf("kvgate holds %.0f KiB per idle stream", (vh-dh)/1024)
	}
	if vg-dg > 2.5 {
		t.Errorf("kvgate runs %.1f goroutines per idle stream", vg-dg)
	}
	waitFor(t, "streams finished", func() bool {
		var in int64
		for i := range s.roster().eps {
			in += s.loads.Get(i)
		}
		return in == 0
	})
}

// idleStreamCount is how many idle streams to hold: KVGATE_SOAK_STREAMS (make soak:
// 10k) or 200, capped by the descriptor limit (through kvgate each stream holds 4 in this
// process: client, kvgate's accepted and upstream connections, the engine's).
func idleStreamCount(t *testing.T) int {
	want := 200
	if v := os.Getenv("KVGATE_SOAK_STREAMS"); v != "" {
		want, _ = strconv.Atoi(v)
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil {
		if rl.Cur < rl.Max {
			rl.Cur = rl.Max
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
			syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
		}
		if fit := (int(rl.Cur) - 1000) / 4; want > fit {
			t.Logf("idle streams: %d wanted, %d fit in RLIMIT_NOFILE=%d", want, fit, rl.Cur)
			want = fit
		}
	}
	return want
}

// holdIdleStreams opens n streams to addr, each read up to its first event, and returns
// heap bytes and goroutines per open stream; then releases and closes them.
func holdIdleStreams(t *testing.T, addr string, n int, allOpen func() bool, release chan struct{}) (heapPer, goPer float64) {
	g0, h0 := runtime.NumGoroutine(), heapInuse()
	conns := make([]net.Conn, 0, n)
	defer func() {
		close(release)
		for _, c := range conns {
			c.Close()
		}
	}()
	body := `{"model":"m","prompt":"idle","stream":true}`
	req := "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n" + body
	buf := make([]byte, 4096)
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(time.Minute))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		var got []byte
		for !strings.Contains(string(got), `"first"`) {
			k, err := c.Read(buf)
			if err != nil {
				t.Fatalf("stream %d: %v after %q", i, err, got)
			}
			got = append(got, buf[:k]...)
		}
	}
	waitFor(t, "all streams in flight", allOpen)
	g1, h1 := runtime.NumGoroutine(), heapInuse()
	return float64(int64(h1)-int64(h0)) / float64(n), float64(g1-g0) / float64(n)
}
