package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testPKI makes a CA and certificates signed by it with the openssl command line (an
// independent implementation: nothing here comes from Go's crypto/x509 generator).
type testPKI struct {
	t   *testing.T
	dir string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl is required (tools/fetch.sh installs it): ", err)
	}
	p := &testPKI{t: t, dir: t.TempDir()}
	p.run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
		"-keyout", p.path("ca.key"), "-out", p.path("ca.pem"), "-days", "2", "-subj", "/CN=kvgate-test-ca")
	return p
}

func (p *testPKI) path(name string) string { return filepath.Join(p.dir, name) }

func (p *testPKI) run(args ...string) {
	p.t.Helper()
	if out, err := exec.Command("openssl", args...).CombinedOutput(); err != nil {
		p.t.Fatalf("openssl %v: %v\n%s", args, err, out)
	}
}

// issue signs a certificate for 127.0.0.1 with common name cn into name.pem/name.key
// (written to a temp name first, then renamed, as a certificate manager would).
func (p *testPKI) issue(name, cn string) (certFile, keyFile string) {
	p.t.Helper()
	tmp := p.path("tmp-" + name)
	os.WriteFile(tmp+".ext", []byte("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"), 0o600)
	p.run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
		"-keyout", tmp+".key", "-out", tmp+".csr", "-subj", "/CN="+cn)
	p.run("x509", "-req", "-in", tmp+".csr", "-CA", p.path("ca.pem"), "-CAkey", p.path("ca.key"),
		"-CAcreateserial", "-out", tmp+".pem", "-days", "2", "-extfile", tmp+".ext")
	certFile, keyFile = p.path(name+".pem"), p.path(name+".key")
	if err := os.Rename(tmp+".key", keyFile); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Rename(tmp+".pem", certFile); err != nil {
		p.t.Fatal(err)
	}
	return certFile, keyFile
}

// curl runs curl against url trusting the test CA; it returns the HTTP code, the body,
// and curl's verbose log (holding the server certificate's subject).
func curl(t *testing.T, ca, url string, args ...string) (code, body, verbose string) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is required (tools/fetch.sh installs it): ", err)
	}
	out := filepath.Join(t.TempDir(), "body")
	full := append([]string{"-sS", "-v", "--cacert", ca, "-o", out, "-w", "%{http_code}", "--max-time", "10"}, args...)
	cmd := exec.Command("curl", append(full, url)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	b, _ := os.ReadFile(out)
	if err != nil {
		return "error", string(b), stderr.String()
	}
	return string(stdout), string(b), stderr.String()
}

// The public listener serves HTTPS with -tls-cert/-tls-key (checked by curl against
// the CA); a renewed certificate written over the files applies to new connections
// without a restart.
func TestTLSListenerReloadsCertificate(t *testing.T) {
	pki := newTestPKI(t)
	cert, key := pki.issue("srv", "kvgate-first")
	a := newFakeEngine(t, "a")
	cfg := testConfig(a.url())
	cfg.Listener.TLSCert, cfg.Listener.TLSKey = cert, key
	s, lb := startLogged(t, cfg, nil)
	url := "https://" + s.PublicAddr() + "/v1/completions"
	code, body, v := curl(t, pki.path("ca.pem"), url, "-H", "Content-Type: application/json", "-d", complBody)
	if code != "200" || !strings.Contains(body, `"cached_tokens":32`) || !strings.Contains(v, "CN=kvgate-first") {
		t.Fatalf("over TLS: %s %q\n%s", code, body, v)
	}
	// Streams relay event by event over TLS too (hertz's standard transport).
	code, body, _ = curl(t, pki.path("ca.pem"), "https://"+s.PublicAddr()+"/v1/chat/completions", "-N",
		"-H", "Content-Type: application/json", "-d", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if code != "200" || body != strings.Join(sseEvents("a"), "") {
		t.Errorf("stream over TLS: %s %q", code, body)
	}
	if rec := a.requests(); rec[len(rec)-1].header.Get("X-Forwarded-Proto") != "https" {
		t.Errorf("X-Forwarded-Proto %q", rec[len(rec)-1].header.Get("X-Forwarded-Proto"))
	}
	// Plain HTTP on the TLS port is not served.
	if res, err := http.Post("http://"+s.PublicAddr()+"/v1/completions", "application/json", strings.NewReader(complBody)); err == nil {
		if res.StatusCode == 200 {
			t.Error("plain HTTP answered 200 on the TLS listener")
		}
		res.Body.Close()
	}
	time.Sleep(20 * time.Millisecond) // a new modification time even on coarse clocks
	pki.issue("srv", "kvgate-renewed")
	waitFor(t, "renewed certificate served", func() bool {
		_, _, v := curl(t, pki.path("ca.pem"), url, "-H", "Content-Type: application/json", "-d", complBody)
		return strings.Contains(v, "CN=kvgate-renewed")
	})
	if len(lb.lines("listener certificate reloaded")) == 0 {
		t.Error("no reload log line")
	}
	// A broken rotation keeps the last good certificate.
	os.WriteFile(cert, []byte("not a certificate"), 0o600)
	waitFor(t, "bad rotation warned", func() bool { return len(lb.lines("level=WARN", "keeping the previous certificate")) > 0 })
	if code, _, v := curl(t, pki.path("ca.pem"), url, "-H", "Content-Type: application/json", "-d", complBody); code != "200" || !strings.Contains(v, "CN=kvgate-renewed") {
		t.Errorf("after a bad rotation: %s\n%s", code, v)
	}
	// The refusal stands on /metrics, and the same bad files are not WARNed every second.
	if m := scrapeMetrics(t, s); m[`kvgate_reload_refused{file="tls"}`] != 1 {
		t.Errorf("kvgate_reload_refused{file=\"tls\"} = %v after a bad rotation, want 1", m[`kvgate_reload_refused{file="tls"}`])
	}
	time.Sleep(2500 * time.Millisecond) // two more reload ticks
	if n := len(lb.lines("level=WARN", "keeping the previous certificate")); n != 1 {
		t.Errorf("%d WARNs for one bad rotation, want 1", n)
	}
	pki.issue("srv", "kvgate-third")
	waitFor(t, "the next good rotation served", func() bool {
		_, _, v := curl(t, pki.path("ca.pem"), url, "-H", "Content-Type: application/json", "-d", complBody)
		return strings.Contains(v, "CN=kvgate-third")
	})
	if m := scrapeMetrics(t, s); m[`kvgate_reload_refused{file="tls"}`] != 0 {
		t.Errorf("kvgate_reload_refused{file=\"tls\"} = %v after a good rotation, want 0", m[`kvgate_reload_refused{file="tls"}`])
	}
}

// https:// endpoints are verified against -upstream-ca, and kvgate presents its
// -upstream-cert to engines that require one. An engine kvgate cannot reach is named in
// the error body, its address is not.
func TestTLSUpstreamWithClientCertificate(t *testing.T) {
	pki := newTestPKI(t)
	srvCert, srvKey := pki.issue("engine", "engine")
	cliCert, cliKey := pki.issue("client", "kvgate-client")
	pair, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(pki.path("ca.pem"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	eng := &fakeEngine{name: "secure"}
	eng.health.Store(200)
	eng.srv = httptest.NewUnstartedServer(http.HandlerFunc(eng.serve))
	eng.srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	eng.srv.StartTLS()
	t.Cleanup(eng.srv.Close)

	sp, err := ParseEndpoint("name=secure,url=" + eng.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Fleet.Endpoints = []EndpointSpec{sp}
	cfg.Upstream.CA, cfg.Upstream.Cert, cfg.Upstream.Key = pki.path("ca.pem"), cliCert, cliKey
	s := startProxy(t, cfg)
	res, body := post(t, s.url("/v1/completions"), complBody)
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != "secure" || !strings.Contains(body, "cmpl-secure") {
		t.Fatalf("https upstream: %d %q", res.StatusCode, body)
	}
	if r := eng.requests(); len(r) != 1 || r[0].path != "/v1/completions" {
		t.Errorf("engine saw %v", r)
	}

	// Without the client certificate the engine refuses the handshake.
	cfg.Upstream.Cert, cfg.Upstream.Key = "", ""
	s2 := startProxy(t, cfg)
	res, body = post(t, s2.url("/v1/completions"), complBody)
	if res.StatusCode != 502 {
		t.Fatalf("without a client certificate: %d %q", res.StatusCode, body)
	}
	checkErrorBody(t, body, 502)
	host := strings.TrimPrefix(eng.srv.URL, "https://")
	if !strings.Contains(body, "secure") || strings.Contains(body, host) || strings.Contains(body, "127.0.0.1") {
		t.Errorf("error body should name the endpoint, not its address: %q", body)
	}

	// A CA file that holds no certificate is refused at start, naming the flag.
	bad := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(bad, []byte("nothing"), 0o600)
	cfg.Upstream.CA = bad
	if _, err := New(cfg, Options{Logger: quietLog}); err == nil || !strings.Contains(err.Error(), "-upstream-ca") {
		t.Errorf("bad CA: %v", err)
	}
}

// -api-keys-file: requests need one of the keys (401 in OpenAI's shape otherwise), the
// client's Authorization reaches the engine unchanged, and a rotated file applies
// without a restart. -forward-authorization=false removes the header upstream.
func TestAPIKeysFromFile(t *testing.T) {
	a := newFakeEngine(t, "a")
	keys := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(keys, []byte("# team A\nsk-alpha\n\nsk-beta\n"), 0o600)
	cfg := testConfig(a.url())
	cfg.Listener.APIKeysFile = keys
	s, _ := startLogged(t, cfg, nil)

	res, body := post(t, s.url("/v1/completions"), complBody)
	if res.StatusCode != 401 {
		t.Fatalf("no key: %d %q", res.StatusCode, body)
	}
	checkErrorBody(t, body, 401)
	if res, _ := post(t, s.url("/v1/completions"), complBody, "Authorization", "Bearer sk-wrong"); res.StatusCode != 401 {
		t.Errorf("wrong key: %d", res.StatusCode)
	}
	if res, _ := post(t, s.url("/v1/models"), "", "Authorization", "Bearer sk-alph"); res.StatusCode != 401 {
		t.Errorf("a key's prefix on a pass-through path: %d", res.StatusCode)
	}
	if res, _ := post(t, s.url("/v1/completions"), complBody, "Authorization", "Bearer sk-beta"); res.StatusCode != 200 {
		t.Fatalf("good key: %d", res.StatusCode)
	}
	if r := a.requests(); len(r) != 1 || r[0].header.Get("Authorization") != "Bearer sk-beta" {
		t.Errorf("engine saw %d requests, Authorization %q", len(r), r[len(r)-1].header.Get("Authorization"))
	}
	if m := scrapeMetrics(t, s); m["kvgate_unauthorized_total"] != 3 {
		t.Errorf("unauthorized_total %v, want 3", m["kvgate_unauthorized_total"])
	}

	time.Sleep(20 * time.Millisecond)
	os.WriteFile(keys, []byte("sk-gamma\n"), 0o600)
	waitFor(t, "rotated keys", func() bool {
		res, _ := post(t, s.url("/v1/completions"), complBody, "Authorization", "Bearer sk-gamma")
		return res.StatusCode == 200
	})
	if res, _ := post(t, s.url("/v1/completions"), complBody, "Authorization", "Bearer sk-beta"); res.StatusCode != 401 {
		t.Errorf("a rotated-out key: %d", res.StatusCode)
	}
	// A rotation to a file that does not load keeps the keys, and says so on /metrics.
	time.Sleep(20 * time.Millisecond)
	os.WriteFile(keys, []byte("# nothing left\n"), 0o600)
	waitFor(t, "the refused rotation shown", func() bool {
		return scrapeMetrics(t, s)[`kvgate_reload_refused{file="api_keys"}`] == 1
	})
	if res, _ := post(t, s.url("/v1/completions"), complBody, "Authorization", "Bearer sk-gamma"); res.StatusCode != 200 {
		t.Errorf("the kept key after a refused rotation: %d", res.StatusCode)
	}
	time.Sleep(20 * time.Millisecond)
	os.WriteFile(keys, []byte("sk-gamma\n"), 0o600)
	waitFor(t, "the refusal cleared", func() bool {
		return scrapeMetrics(t, s)[`kvgate_reload_refused{file="api_keys"}`] == 0
	})

	cfg.Listener.ForwardAuthorization = false
	b := newFakeEngine(t, "b")
	cfg.Fleet.Endpoints = testConfig(b.url()).Fleet.Endpoints
	s2 := startProxy(t, cfg)
	if res, _ := post(t, s2.url("/v1/completions"), complBody, "Authorization", "Bearer sk-gamma"); res.StatusCode != 200 {
		t.Fatalf("stripped: %d", res.StatusCode)
	}
	if r := b.requests(); len(r) != 1 || r[0].header.Get("Authorization") != "" {
		t.Errorf("engine got Authorization %q with -forward-authorization=false", r[0].header.Get("Authorization"))
	}

	os.WriteFile(keys, []byte("# nothing\n"), 0o600)
	if _, err := New(cfg, Options{Logger: quietLog}); err == nil || !strings.Contains(err.Error(), "-api-keys-file") {
		t.Errorf("empty keys file: %v", err)
	}
}

// The API key check allocates nothing (it runs on every request).
func TestAPIKeyCheckAllocs(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(keys, []byte("k1\nk2\nk3\n"), 0o600)
	k, err := newAPIKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	good, bad := []byte("Bearer k2"), []byte("Bearer k4")
	if !k.allow(good) || k.allow(bad) || k.allow([]byte("k2")) || k.allow(nil) {
		t.Fatal("allow")
	}
	if n := testing.AllocsPerRun(100, func() { k.allow(good); k.allow(bad) }); n != 0 {
		t.Errorf("%v allocs per check", n)
	}
}
