package proxy

import (
	"fmt"
	"io"
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
