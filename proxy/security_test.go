package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRequestCannotChooseUpstream: absolute-URI request lines, Host headers, userinfo
// tricks, CONNECT and X-Forwarded-Host never send a request anywhere but a configured
// endpoint: a trap server on another loopback port must see nothing.
func TestRequestCannotChooseUpstream(t *testing.T) {
	a := newFakeEngine(t, "a")
	var trapped atomic.Int32
	trap := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		trapped.Add(1)
		w.WriteHeader(299)
	}))
	defer trap.Close()
	th := strings.TrimPrefix(trap.URL, "http://")
	s := startProxy(t, testConfig(a.url()))
	body := `{"model":"m","prompt":"x"}`
	reqs := []string{
		rawPost("http://"+th+"/v1/completions", body),
		rawPost("/v1/completions", body, "X-Forwarded-Host: "+th, "Forwarded: host="+th),
		strings.Replace(rawPost("/v1/completions", body), "Host: kvgate", "Host: "+th, 1),
		"GET http://" + th + "/v1/models HTTP/1.1\r\nHost: " + th + "\r\nConnection: close\r\n\r\n",
		"GET @" + th + "/x HTTP/1.1\r\nHost: kvgate\r\nConnection: close\r\n\r\n",
		"GET //" + th + "/x HTTP/1.1\r\nHost: kvgate\r\nConnection: close\r\n\r\n",
		"GET /..%2f..%2f" + th + "/x HTTP/1.1\r\nHost: kvgate\r\nConnection: close\r\n\r\n",
		"CONNECT " + th + " HTTP/1.1\r\nHost: " + th + "\r\nConnection: close\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: " + th + "\r\nConnection: close\r\n\r\n",
	}
	for _, r := range reqs {
		res, _ := rawExchange(t, s.PublicAddr(), r)
		if res.StatusCode == 299 {
			t.Errorf("%.60q answered by the trap", r)
		}
	}
	if n := trapped.Load(); n != 0 {
		t.Fatalf("requests reached a target they named: %d", n)
	}
	// The engine saw the two OpenAI posts with its own Host.
	for _, r := range a.requests() {
		if r.header.Get("X-Forwarded-Host") != "" && r.header.Get("X-Forwarded-Host") != th {
			t.Errorf("X-Forwarded-Host altered: %v", r.header)
		}
	}
	if n := a.count("/v1/completions"); n != 3 {
		t.Errorf("engine got %d completions, want 3", n)
	}
}

// TestAdminIsolation: pprof, metrics, inventory and the admin switches are on the admin
// listener only (the public one passes those paths to an engine, which 404s them), and
// the admin listener defaults to loopback.
func TestAdminIsolation(t *testing.T) {
	if d := Defaults(); !strings.HasPrefix(d.Listener.AdminAddr, "127.0.0.1:") {
		t.Errorf("default admin listener %q is not loopback", d.Listener.AdminAddr)
	}
	a := newFakeEngine(t, "a")
	s := startProxy(t, testConfig(a.url()))
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/metrics", "/debug/inventory"} {
		res, err := httpc.Get(s.url(p))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 404 || res.Header.Get("x-kvgate-endpoint") != "e0" {
			t.Errorf("public %s: %d (endpoint %q), want the engine's 404", p, res.StatusCode, res.Header.Get("x-kvgate-endpoint"))
		}
		res, err = httpc.Get(s.admURL(p))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("admin %s: %d", p, res.StatusCode)
		}
	}
	res, _ := post(t, s.url("/admin/endpoints/e0/down"), "")
	if res.StatusCode != 404 || s.roster().eps[0].down.Load() {
		t.Errorf("admin switch reachable on the public listener: %d down=%v", res.StatusCode, s.roster().eps[0].down.Load())
	}
}
