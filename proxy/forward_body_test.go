package proxy

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
)

// The upstream request borrows the client's body (no copy): under concurrent requests with
// distinct bodies, from pooled request states, every engine receives exactly the bytes one
// client sent, none mixed with another's.
func TestForwardBorrowedBodiesIntact(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	s := startProxy(t, testConfig(a.url(), b.url()))
	const n = 64
	sent := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := range sent {
		sent[i] = fmt.Sprintf(`{"model":"m","prompt":"client %d %s"}`, i, strings.Repeat(fmt.Sprintf("w%d ", i), 2000+i*37))
		wg.Add(1)
		go func(body string) {
			defer wg.Done()
			res, err := httpc.Post(s.url("/v1/completions"), "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err.Error()
				return
			}
			out, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				errs <- fmt.Sprintf("status %d %.100s", res.StatusCode, out)
			}
		}(sent[i])
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	var got []string
	for _, e := range []*fakeEngine{a, b} {
		for _, r := range e.requests() {
			if r.path == "/v1/completions" {
				got = append(got, r.body)
			}
		}
	}
	sort.Strings(got)
	sort.Strings(sent)
	if len(got) != n {
		t.Fatalf("engines got %d requests, want %d", len(got), n)
	}
	for i := range sent {
		if got[i] != sent[i] {
			t.Fatalf("an engine got a body no client sent: %.120s", got[i])
		}
	}
}

// The borrowed body (hertz's own buffer, no copy) is the same bytes on a retry: the first
// engine answers 503, the second gets exactly what the client sent, request after request
// on one kept-alive connection of different sizes.
func TestForwardBorrowedBodyOnRetry(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	a.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.URL.Path == "/v1/completions" {
			w.WriteHeader(503)
			return true
		}
		return false
	}
	s := startProxy(t, testConfig(a.url(), b.url()))
	var sent []string
	for i := range 12 {
		body := fmt.Sprintf(`{"model":"m","prompt":"retry %d %s"}`, i, strings.Repeat(fmt.Sprintf("r%d ", i), 500+(i%3)*4000))
		sent = append(sent, body)
		res, err := httpc.Post(s.url("/v1/completions"), "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, res.StatusCode)
		}
	}
	var got []string
	for _, r := range b.requests() {
		if r.path == "/v1/completions" {
			got = append(got, r.body)
		}
	}
	if len(got) != len(sent) {
		t.Fatalf("engine b got %d requests, want %d", len(got), len(sent))
	}
	for i := range sent {
		if got[i] != sent[i] {
			t.Fatalf("request %d: engine b got %.80s, want %.80s", i, got[i], sent[i])
		}
	}
}
