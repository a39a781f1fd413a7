package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// A half-open breaker's trial whose answer is never judged (here: the engine's interim
// 103 answer, which forward books as neither success nor failure) must not hold the
// trial slot forever: once the engine answers normally, the breaker closes again.
func TestBreakerHalfOpenTrialSlotNotLeaked(t *testing.T) {
	var mode atomic.Int32 // 0: close at once (connect failure), 1: 103 interim, 2: 200
	url := rawEngine(t, func(conn net.Conn) {
		defer conn.Close()
		br := bufio.NewReader(conn)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			switch mode.Load() {
			case 0:
				return
			case 1:
				io.WriteString(conn, "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			default:
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			}
		}
	})
	cfg := testConfig(url)
	cfg.Breaker.Failures, cfg.Breaker.OpenFor, cfg.Breaker.HalfOpen = 1, 200*time.Millisecond, 1
	s := startProxy(t, cfg)
	b := s.roster().eps[0].breaker
	post(t, s.url("/v1/completions"), complBody)
	if st := b.State(); st != BreakerOpen {
		t.Fatalf("breaker %v after a connect failure, want open", st)
	}
	mode.Store(1)
	waitFor(t, "half-open", func() bool { return b.State() == BreakerHalfOpen })
	if res, _ := post(t, s.url("/v1/completions"), complBody); res.StatusCode != 502 {
		t.Fatalf("interim answer: %d, want 502", res.StatusCode)
	}
	mode.Store(2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, body := post(t, s.url("/v1/completions"), complBody)
		if res.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine healthy again but the breaker never closed: %d %s (state %v)", res.StatusCode, body, b.State())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := b.State(); st != BreakerClosed {
		t.Errorf("breaker %v after a good trial, want closed", st)
	}
}
