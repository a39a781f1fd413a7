package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// Admin adds that arrive together each hold: none is lost to another's change (each
// derived its admin list from the same snapshot, and the last commit won).
func TestFleetAdminConcurrentAdminAddsKeepEach(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Fleet.MaxEndpoints = 64
	s := startProxy(t, cfg)
	const n = 12
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, _ := post(t, s.admURL("/admin/endpoints"), fmt.Sprintf("name=n%d,url=%s", i, a.url()))
			codes[i] = res.StatusCode
		}()
	}
	wg.Wait()
	var lost []string
	for i := range n {
		if codes[i] != 200 {
			t.Errorf("add n%d: %d", i, codes[i])
		}
		if s.slotOf(fmt.Sprintf("n%d", i)) < 0 {
			lost = append(lost, fmt.Sprintf("n%d", i))
		}
	}
	if len(lost) > 0 {
		t.Errorf("answered 200 but not in the fleet: %v (fleet %s)", lost, s.liveNames())
	}
}

// A refused -endpoints-file stays visible (gauge, /debug/inventory) while other sources
// change the fleet: a DNS round or an admin call that applies says nothing about the
// file, which the running fleet still does not follow.
func TestFleetAdminFileRefusalOutlivesOtherChanges(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	dns := startDNS(t)
	dns.set("pool.test", "127.0.0.1")
	port := a.url()[strings.LastIndex(a.url(), ":")+1:]
	file := filepath.Join(t.TempDir(), "endpoints")
	good := "name=a,url=" + a.url() + "\n"
	writeAtomic(t, file, good)
	cfg := testConfig()
	cfg.Fleet.Endpoints, _ = ReadEndpointsFile(file)
	tmpl, err := ParseEndpoint("name=pool,url=http://pool.test:" + port + ",discover=dns")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fleet.Endpoints = append([]EndpointSpec{tmpl}, cfg.Fleet.Endpoints...)
	cfg.Fleet.StaticEndpoints = 1
	cfg.Fleet.EndpointsFile, cfg.Fleet.EndpointsWatch = file, 10*time.Millisecond
	cfg.Fleet.DNSInterval = 20 * time.Millisecond
	lb := &logBuf{}
	s := startWith(t, cfg, Options{Resolver: dns.resolver(), Logger: lb.logger()})
	writeAtomic(t, file, good+"name=c,url=ftp://x\n")
	waitFor(t, "the refusal", func() bool { return len(lb.lines("-endpoints-file reload refused")) > 0 })
	if res, body := post(t, s.admURL("/admin/endpoints"), "name=b,url="+b.url()); res.StatusCode != 200 {
		t.Fatalf("add b: %d %s", res.StatusCode, body)
	}
	time.Sleep(200 * time.Millisecond) // several DNS rounds
	_, m := get(t, s.admURL("/metrics"))
	_, inv := get(t, s.admURL("/debug/inventory"))
	if !strings.Contains(m, "kvgate_fleet_change_refused 1") || !strings.Contains(inv, `"last_refused": "-endpoints-file: `+file+`:2`) {
		t.Errorf("the file's refusal vanished although the file is still refused:\n%s\n%s", grepLines(m, "fleet"), inv[:min(len(inv), 400)])
	}
	writeAtomic(t, file, good)
	waitFor(t, "the fixed file clears it", func() bool {
		_, m := get(t, s.admURL("/metrics"))
		return strings.Contains(m, "kvgate_fleet_change_refused 0")
	})
}

// An -endpoints-file that turns unreadable is a degraded state: the fleet no longer
// follows it. It shows (gauge, /debug/inventory) and WARNs once, not every poll; once
// readable again with the same content the state clears.
func TestFleetAdminUnreadableEndpointsFileVisible(t *testing.T) {
	a := newFakeEngine(t, "a")
	file := filepath.Join(t.TempDir(), "endpoints")
	good := "name=a,url=" + a.url() + "\n"
	writeAtomic(t, file, good)
	cfg := testConfig()
	cfg.Fleet.Endpoints, _ = ReadEndpointsFile(file)
	cfg.Fleet.EndpointsFile, cfg.Fleet.EndpointsWatch = file, 10*time.Millisecond
	lb := &logBuf{}
	s := startWith(t, cfg, Options{Logger: lb.logger()})
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the WARN", func() bool { return len(lb.lines("-endpoints-file unreadable")) > 0 })
	time.Sleep(150 * time.Millisecond) // ~15 polls
	if n := len(lb.lines("-endpoints-file unreadable")); n != 1 {
		t.Errorf("%d WARNs for one unreadable episode, want 1", n)
	}
	_, m := get(t, s.admURL("/metrics"))
	_, inv := get(t, s.admURL("/debug/inventory"))
	if !strings.Contains(m, "kvgate_fleet_change_refused 1") || !strings.Contains(inv, `"last_refused": "-endpoints-file: `) {
		t.Errorf("an unreadable file is not visible:\n%s\n%s", grepLines(m, "fleet"), inv[:min(len(inv), 400)])
	}
	writeAtomic(t, file, good)
	waitFor(t, "the file back clears it", func() bool {
		_, m := get(t, s.admURL("/metrics"))
		return strings.Contains(m, "kvgate_fleet_change_refused 0")
	})
	if s.liveNames() != "a" {
		t.Errorf("fleet %s", s.liveNames())
	}
}

// A DNS server that stops answering must not stall /metrics or /debug/inventory: the
// fleet's DNS rounds wait up to dnsTimeout per name, and scrapes must not wait with them.
// Shutdown does not wait for a lookup either.
func TestFleetAdminDNSOutageKeepsAdminResponsive(t *testing.T) {
	a := newFakeEngine(t, "a")
	dns := startDNS(t)
	dns.set("pool.test", "127.0.0.1")
	port := a.url()[strings.LastIndex(a.url(), ":")+1:]
	cfg := testConfig()
	tmpl, err := ParseEndpoint("name=pool,url=http://pool.test:" + port + ",discover=dns")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fleet.Endpoints = []EndpointSpec{tmpl}
	cfg.Fleet.DNSInterval = 20 * time.Millisecond
	// A resolver that asks the test server until muted, then a socket that never answers.
	silent := listenUDP(t)
	var mute atomic.Bool
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		addr := dns.conn.LocalAddr().String()
		if mute.Load() {
			addr = silent.LocalAddr().String()
		}
		var dl net.Dialer
		return dl.DialContext(ctx, "udp", addr)
	}}
	s := startWith(t, cfg, Options{Resolver: r})
	mute.Store(true)
	time.Sleep(100 * time.Millisecond) // a DNS round is waiting on the silent server now
	for _, path := range []string{"/metrics", "/debug/inventory"} {
		t0 := time.Now()
		if code := getStatus(t, s.admURL(path)); code != 200 {
			t.Errorf("%s: %d", path, code)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("%s took %v during a DNS outage", path, d.Round(time.Millisecond))
		}
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.Shutdown(ctx)
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("Shutdown took %v: it waited for a DNS lookup", d.Round(time.Millisecond))
	}
}

func listenUDP(t *testing.T) *net.UDPConn {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readAll GETs or POSTs and returns status and body.
func doReq(t *testing.T, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := httpc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// An endpoint whose events= the subscriber cannot use is refused at start; added at
// runtime it was answered 200 and joined the fleet without a subscriber (an ERROR in
// the log only). Refused the same way as at start, naming the key.
func TestFleetAdminRuntimeAddRefusesBadEvents(t *testing.T) {
	a := newKVEngine(t, "a", enginepub.VLLM)
	s := startProxy(t, kvConfig(t, KVConverged, a.spec(0, "vllm", "")))
	for _, spec := range []string{
		"name=z,url=" + a.url() + ",engine=vllm,events=127.0.0.1:5557",
		"name=z,url=" + a.url() + ",engine=vllm,events=tcp://127.0.0.1",
		"name=z,url=" + a.url() + ",engine=vllm,events=tcp://*:5557",
		"name=z,url=" + a.url() + ",engine=sglang,events=tcp://127.0.0.1:5557,replay=127.0.0.1:5558",
	} {
		code, body := doReq(t, "POST", s.admURL("/admin/endpoints"), spec)
		if code != 400 || !strings.Contains(body, "events") && !strings.Contains(body, "replay") {
			t.Errorf("POST %q: %d %s", spec, code, body)
		}
		if s.slotOf("z") >= 0 {
			t.Fatalf("%q joined the fleet (%s)", spec, s.liveNames())
		}
	}
	cfg := kvConfig(t, KVConverged, "name=z,url="+a.url()+",engine=vllm,events=127.0.0.1:5557")
	err := cfg.Validate()
	if fe, ok := err.(*FlagError); !ok || fe.Flag != "-endpoint" || !strings.Contains(fe.Msg, "events=") {
		t.Errorf("at start: %v", err)
	}
}

// A url= without a host, or with a port no TCP connection can use, is not an engine.
func TestFleetAdminEndpointURLNeedsHostAndPort(t *testing.T) {
	for _, u := range []string{"http://:8000", "http://127.0.0.1:0", "http://127.0.0.1:70000", "https://:443"} {
		if _, err := ParseEndpoint("name=x,url=" + u); err == nil || !strings.Contains(err.Error(), "url") {
			t.Errorf("url=%s: %v", u, err)
		}
	}
	for _, u := range []string{"http://127.0.0.1:8000", "http://engine", "https://[::1]:8443"} {
		if _, err := ParseEndpoint("name=x,url=" + u); err != nil {
			t.Errorf("url=%s: %v", u, err)
		}
	}
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	code, body := doReq(t, "POST", s.admURL("/admin/endpoints"), "name=z,url=http://:8000")
	if code != 400 {
		t.Errorf("POST url=http://:8000: %d %s", code, body)
	}
	checkErrorBody(t, body, 400)
}

// The admin listener answers its own refusals in the OpenAI error shape like every
// other error it gives: no token, a method a route does not take, a path it does not
// serve.
func TestFleetAdminAdminErrorsAreJSON(t *testing.T) {
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Listener.AdminToken = "sekret"
	s := startProxy(t, cfg)
	auth := []string{"Authorization", "Bearer sekret"}
	for _, tc := range []struct {
		method, path string
		hdr          []string
		code         int
	}{
		{"GET", "/debug/inventory", nil, 401},
		{"POST", "/admin/endpoints", []string{"Authorization", "Bearer wrong"}, 401},
		{"GET", "/admin/endpoints/e0/down", auth, 405},
		{"GET", "/admin/endpoints", auth, 405},
		{"PUT", "/admin/endpoints/e0", auth, 405},
		{"GET", "/nope", auth, 404},
		{"DELETE", "/admin/endpoints/a/b", auth, 405},
	} {
		code, body := doReq(t, tc.method, s.admURL(tc.path), "", tc.hdr...)
		if code != tc.code {
			t.Errorf("%s %s: %d want %d (%s)", tc.method, tc.path, code, tc.code, body)
			continue
		}
		checkErrorBody(t, body, tc.code)
	}
	if code, _ := doReq(t, "GET", s.admURL("/debug/pprof"), "", auth...); code != 200 { // redirected to /debug/pprof/
		t.Errorf("/debug/pprof: %d", code)
	}
	if code, body := doReq(t, "GET", s.admURL("/healthz"), ""); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
}

// -health-path is joined to each endpoint's URL: one without its leading slash probes
// http://host:portpath, every check fails and every endpoint turns unhealthy. Refused,
// naming the flag.
func TestFleetAdminHealthPathNeedsSlash(t *testing.T) {
	cfg := testConfig("http://127.0.0.1:8000")
	cfg.Health.Interval, cfg.Health.Path = time.Second, "health"
	err := cfg.Validate()
	if fe, ok := err.(*FlagError); !ok || fe.Flag != "-health-path" {
		t.Errorf("-health-path health: %v", err)
	}
	cfg.Health.Path = "/health"
	if err := cfg.Validate(); err != nil {
		t.Errorf("-health-path /health: %v", err)
	}
}

// The load scrape's timeout is bounded by -health-timeout; with health checks off that
// flag is not checked, and 0 made every scrape time out at once.
func TestFleetAdminScrapeWithoutHealthTimeout(t *testing.T) {
	a := newKVEngine(t, "a", enginepub.VLLM)
	a.handle = func(w http.ResponseWriter, r *http.Request, _ []byte) bool {
		if r.URL.Path != "/metrics" {
			return false
		}
		io.WriteString(w, "vllm:num_requests_running{model_name=\"m\"} 1\nvllm:num_requests_waiting{model_name=\"m\"} 0\n")
		return true
	}
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""))
	cfg.Health.Interval, cfg.Health.Timeout = 0, 0
	cfg.KV.LoadScrape = 20 * time.Millisecond
	s := startProxy(t, cfg)
	time.Sleep(300 * time.Millisecond)
	e := s.roster().eps[0]
	if e.scrape.ok.Load() == 0 {
		msg := ""
		if p := e.scrape.lastErr.Load(); p != nil {
			msg = *p
		}
		t.Errorf("no scrape read the engine: %d failed, last error %q", e.scrape.failed.Load(), msg)
	}
}

// Mode 1 pins a session to its prefill/decode slots. When the prefill endpoint leaves and
// another takes its slot, the session must not follow the slot to the newcomer (which
// holds none of its KV) on the strength of the old pairing: the drain forgets it.
func TestFleetAdminRemovedPrefillForgetsAffinity(t *testing.T) {
	p1, p2, p3 := newKVEngine(t, "p1", enginepub.VLLM), newKVEngine(t, "p2", enginepub.VLLM), newKVEngine(t, "p3", enginepub.VLLM)
	dec := newKVEngine(t, "d1", enginepub.VLLM)
	prefill := func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":`+vllmKTP+`}`)
		return true
	}
	p1.handle, p2.handle, p3.handle = prefill, prefill, prefill
	cfg := kvConfig(t, KVDisaggregated, p1.spec(0, "vllm", ",role=prefill"), p3.spec(1, "vllm", ",role=prefill"), dec.spec(2, "vllm", ",role=decode"))
	cfg.Fleet.MaxEndpoints = 3 // p2 can only take the removed endpoint's slot
	s := startProxy(t, cfg)
	body := `{"model":"qwen3","messages":[{"role":"user","content":"hello"}],"max_tokens":5,"user":"alice"}`
	turn := func() (route, prefill string) {
		res, out := post(t, s.url("/v1/chat/completions"), body)
		if res.StatusCode != 200 {
			t.Fatalf("%d %s", res.StatusCode, out)
		}
		return res.Header.Get("x-kvgate-route"), res.Header.Get("x-kvgate-prefill")
	}
	_, pinned := turn()
	if route, p := turn(); route != "affinity" || p != pinned {
		t.Fatalf("second turn: route %q prefill %q, want affinity on %s", route, p, pinned)
	}
	slot := s.slotOf(pinned)
	if code, out := doReq(t, "DELETE", s.admURL("/admin/endpoints/"+pinned), ""); code != 200 {
		t.Fatalf("remove %s: %d %s", pinned, code, out)
	}
	waitFor(t, "the removed endpoint's slot freed", func() bool { return s.roster().eps[slot].vacant })
	if code, out := doReq(t, "POST", s.admURL("/admin/endpoints"), p2.spec(0, "vllm", ",role=prefill")); code != 200 {
		t.Fatalf("add p2: %d %s", code, out)
	}
	if got := s.slotOf("p2"); got != slot {
		t.Fatalf("p2 took slot %d, want the removed endpoint's %d", got, slot)
	}
	route, now := turn()
	if route == "affinity" {
		t.Fatalf("after the swap: route affinity to %s, want the ladder's pick, not the old pairing", now)
	}
	if route, p := turn(); route != "affinity" || p != now {
		t.Fatalf("next turn: route %q prefill %q, want affinity on %s", route, p, now)
	}
}
