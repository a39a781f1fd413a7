package proxy

import (
	"io"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
)

func readyz(t *testing.T, s *Server) (int, string) {
	t.Helper()
	res, err := httpc.Get(s.admURL("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res.StatusCode, string(b)
}

func adminOp(t *testing.T, s *Server, name, op string) {
	t.Helper()
	res, err := httpc.Post(s.admURL("/admin/endpoints/"+name+"/"+op), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("%s %s: %d", name, op, res.StatusCode)
	}
}

// Mode 1 is ready only with an eligible prefill AND decode endpoint: with one side
// drained every request would be answered 503, so /readyz says 503 and names the side.
func TestReadyPDNeedsBothSides(t *testing.T) {
	p, d := newKVEngine(t, "p", enginepub.VLLM), newKVEngine(t, "d", enginepub.VLLM)
	s := startProxy(t, kvConfig(t, KVDisaggregated, p.spec(0, "vllm", ",role=prefill"), d.spec(1, "vllm", ",role=decode")))
	if code, body := readyz(t, s); code != 200 {
		t.Fatalf("both sides up: %d %q", code, body)
	}
	adminOp(t, s, "d", "down")
	if code, body := readyz(t, s); code != 503 || !strings.Contains(body, "no eligible decode endpoint") {
		t.Errorf("decode drained: %d %q", code, body)
	}
	if res, _ := post(t, s.url("/v1/completions"), complPrompt("hello")); res.StatusCode != 503 {
		t.Errorf("request with no decode endpoint: %d", res.StatusCode)
	}
	adminOp(t, s, "d", "up")
	adminOp(t, s, "p", "down")
	if code, body := readyz(t, s); code != 503 || !strings.Contains(body, "no eligible prefill endpoint") {
		t.Errorf("prefill drained: %d %q", code, body)
	}
	adminOp(t, s, "p", "up")
	if code, _ := readyz(t, s); code != 200 {
		t.Errorf("both back: %d", code)
	}
}

// BeginDrain turns /readyz 503 (and kvgate_ready 0) while requests are still served.
func TestBeginDrainUnreadyButServing(t *testing.T) {
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	if code, _ := readyz(t, s); code != 200 {
		t.Fatalf("before: %d", code)
	}
	s.BeginDrain()
	if code, body := readyz(t, s); code != 503 || !strings.Contains(body, "shutting down") {
		t.Errorf("draining: %d %q", code, body)
	}
	res, _ := post(t, s.url("/v1/completions"), complBody)
	if res.StatusCode != 200 || !res.Close {
		t.Errorf("request while draining: %d close=%v (want 200, Connection: close)", res.StatusCode, res.Close)
	}
	if m := scrapeMetrics(t, s); m["kvgate_ready"] != 0 {
		t.Errorf("kvgate_ready %v while draining", m["kvgate_ready"])
	}
}
