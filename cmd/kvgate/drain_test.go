package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

// TestMain removes the kvgate binary the process tests built (once, on first use).
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// kvgateBinary builds this package's binary once for tests that run it as a child
// process (signals, exit codes, listeners as in production).
func kvgateBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "kvgate-bin")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "kvgate")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// child is a running kvgate process and its stderr.
type child struct {
	cmd    *exec.Cmd
	stderr *lockedWriter
	buf    *bytes.Buffer
	done   chan struct{} // closed when the process has exited; err holds Wait's answer
	err    error
}

func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	buf := &bytes.Buffer{}
	c := &child{cmd: exec.Command(kvgateBinary(t), args...), buf: buf, stderr: &lockedWriter{w: buf}, done: make(chan struct{})}
	c.cmd.Stderr = c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		<-c.done
	})
	return c
}

func (c *child) log() string {
	c.stderr.mu.Lock()
	defer c.stderr.mu.Unlock()
	return c.buf.String()
}

func waitStatus(t *testing.T, url string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		res, err := http.Get(url)
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered %d (last: %v)", url, want, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A rolling deploy: SIGTERM to a real kvgate serve process while streams run. /readyz
// turns 503 at once; for the drain delay the public listener still serves new
// requests; then it stops accepting and every stream runs to its end; the process
// exits 0.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	const events, every = 30, 100 * time.Millisecond // a 3 s stream
	engine := newSlowEngine(t, events, every)
	pub, adm := freeAddr(t), freeAddr(t)
	const delay = 1500 * time.Millisecond
	c := startChild(t, "serve", "-listen", pub, "-admin-listen", adm, "-endpoint", "name=e,url="+engine.URL,
		"-health-interval", "0", "-shutdown-delay", delay.String(), "-shutdown-grace", "20s")
	waitStatus(t, "http://"+adm+"/readyz", 200, 20*time.Second)

	const streams = 4
	var wg sync.WaitGroup
	results := make(chan string, streams)
	started := make(chan struct{}, streams)
	for i := 0; i < streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := http.Post("http://"+pub+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				results <- "post: " + err.Error()
				started <- struct{}{}
				return
			}
			defer res.Body.Close()
			r := bufio.NewReader(res.Body)
			n, first := 0, true
			for {
				line, err := r.ReadString('\n')
				if strings.HasPrefix(line, "data: ") {
					n++
					if first {
						first = false
						started <- struct{}{}
					}
				}
				if err != nil {
					break
				}
			}
			if n != events+1 {
				results <- fmt.Sprintf("stream cut: %d of %d data lines", n, events+1)
				return
			}
			results <- "ok"
		}()
	}
	for i := 0; i < streams; i++ {
		<-started
	}
	sent := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, "http://"+adm+"/readyz", 503, 500*time.Millisecond)
	// Still serving during the delay, on a fresh connection.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	res, err := hc.Post("http://"+pub+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatalf("request during the drain delay: %v", err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || time.Since(sent) >= delay {
		t.Fatalf("during the delay: %d after %v", res.StatusCode, time.Since(sent))
	}
	// After the delay the listener refuses new connections while the streams go on.
	time.Sleep(time.Until(sent.Add(delay + 500*time.Millisecond)))
	if _, err := hc.Post("http://"+pub+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`)); err == nil {
		t.Error("the public listener still accepts after the drain delay")
	}
	wg.Wait()
	close(results)
	for r := range results {
		if r != "ok" {
			t.Error(r)
		}
	}
	select {
	case <-c.done:
		if c.err != nil {
			t.Errorf("exit: %v\n%s", c.err, c.log())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("kvgate did not exit after its streams ended\n%s", c.log())
	}
	if !strings.Contains(c.log(), "draining: /readyz answers 503") {
		t.Errorf("no drain log line:\n%s", c.log())
	}
}

// newSlowEngine streams n SSE events, one per interval, then [DONE]; other requests
// get a small JSON answer.
func newSlowEngine(t *testing.T, n int, every time.Duration) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"ok":true}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			fl.Flush()
			time.Sleep(every)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}
