package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A keep-alive TLS connection whose requests outlive watchAfter: each one is watched, and
// the watch must neither eat the next request's bytes nor leave a deadline behind.
// The second request arrives while the first is in flight (the watcher's Peek finds
// it: pipelining); the third is sent after the second answer, so its watch ends by
// stop's deadline; the fourth checks the connection still serves after that.
func TestClientWatchKeepAlivePipelined(t *testing.T) {
	a := newFakeEngine(t, "a")
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		time.Sleep(2 * watchAfter)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"echo":`+string(body[strings.Index(string(body), `"prompt":`)+9:len(body)-1])+`}`)
		return true
	}
	pki := newTestPKI(t)
	cfg := testConfig(a.url())
	cfg.Listener.TLSCert, cfg.Listener.TLSKey = pki.issue("srv", "kvgate")
	s := startProxy(t, cfg)
	conn, err := tls.Dial("tcp", s.PublicAddr(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(n int) {
		body := `{"model":"m","prompt":"p` + itoa(n) + `"}`
		io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
	}
	br := bufio.NewReader(conn)
	recv := func(n int) {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d: %v", n, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if want := `{"echo":"p` + itoa(n) + `"}`; res.StatusCode != 200 || string(b) != want {
			t.Fatalf("answer %d: %d %q, want %q", n, res.StatusCode, b, want)
		}
	}
	send(1)
	time.Sleep(watchAfter + watchAfter/2) // the first request is watched by now
	send(2)
	recv(1)
	recv(2)
	send(3)
	recv(3)
	time.Sleep(watchAfter)
	send(4)
	recv(4)
	if n := a.count("/v1/completions"); n != 4 {
		t.Errorf("engine saw %d requests, want 4", n)
	}
}

// The watch is what cancels a non-streamed request when the client leaves on the TLS
// listener (hertz's standard transport); the plain listener's is netpoll's
// (TestClientDisconnectCancelsNonStream).
func TestClientDisconnectCancelsNonStreamTLS(t *testing.T) {
	a := newFakeEngine(t, "a")
	cancelled := make(chan struct{})
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(20 * time.Second):
		}
		return true
	}
	pki := newTestPKI(t)
	cfg := testConfig(a.url())
	cfg.Upstream.Timeout = time.Minute // the cancel is the client's leaving, not the timeout
	cfg.Listener.TLSCert, cfg.Listener.TLSKey = pki.issue("srv", "kvgate")
	s := startProxy(t, cfg)
	conn, err := tls.Dial("tcp", s.PublicAddr(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","prompt":"x"}`
	io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
	waitFor(t, "in flight", func() bool { return s.loads.Get(0) == 1 })
	conn.Close()
	select {
	case <-cancelled:
	case <-time.After(15 * time.Second):
		t.Fatal("engine request not cancelled after the client left")
	}
	waitFor(t, "in-flight released", func() bool { return s.loads.Get(0) == 0 })
}
