package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/bench/enginesim"
)

// simEncoder is the engine simulators' tokenizer (the same qwen3 files kvgate loads).
var (
	simEncOnce sync.Once
	simEnc     enginesim.Encoder
	simEncErr  error
)

func simEncoder(t *testing.T) enginesim.Encoder {
	simEncOnce.Do(func() { simEnc, simEncErr = enginesim.LoadEncoder("qwen3", qwen3Dir(t)) })
	if simEncErr != nil {
		t.Fatal(simEncErr)
	}
	return simEnc
}

// launchSim starts a vLLM engine simulator serving HTTP on listen and publishing its KV
// events (sha256_cbor, the rule's contract) on events.
func launchSim(t *testing.T, name, listen, events string) *enginesim.Sim {
	t.Helper()
	sim, err := enginesim.Launch(enginesim.Spec{Name: name, Model: "qwen3", Encoder: simEncoder(t), BlockSize: blockSize,
		HashAlgo: "sha256_cbor", Listen: listen, Events: events, DefaultMaxTokens: 2, NumBlocks: 1 << 14})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

func simSpec(name string, sim *enginesim.Sim) string {
	return fmt.Sprintf("name=%s,url=%s,engine=vllm,events=%s", name, sim.URL(), sim.EventsAddr())
}

// slotOf is the slot of the live endpoint named name (-1: none).
func (s *Server) slotOf(name string) int {
	for i, e := range s.roster().eps {
		if !e.retired.Load() && e.spec.Name == name {
			return i
		}
	}
	return -1
}

// liveNames are the fleet's endpoint names in slot order.
func (s *Server) liveNames() string {
	var out []string
	for _, e := range s.roster().eps {
		if !e.retired.Load() {
			out = append(out, e.spec.Name)
		}
	}
	return strings.Join(out, ",")
}

// vacant says slot i was freed (its endpoint drained, keys cleared).
func (s *Server) vacant(i int) bool { return s.roster().eps[i].vacant }

// writeAtomic replaces path's content the way a deploy tool or a ConfigMap update does.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// traffic keeps workers sending completions through s until stop; every answer that is
// not a 200 is a failure.
type traffic struct {
	sent, failed atomic.Int64
	mu           sync.Mutex
	failures     []string
	stop         chan struct{}
	wg           sync.WaitGroup
}

func startTraffic(t *testing.T, s *Server, workers int, prompt func(w, i int) string) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	for w := range workers {
		tr.wg.Add(1)
		go func() {
			defer tr.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-tr.stop:
					return
				default:
				}
				req, _ := http.NewRequest("POST", s.url("/v1/completions"), strings.NewReader(complPrompt(prompt(w, i))))
				req.Header.Set("Content-Type", "application/json")
				res, err := httpc.Do(req)
				tr.sent.Add(1)
				if err != nil || res.StatusCode != 200 {
					tr.failed.Add(1)
					tr.mu.Lock()
					if err != nil {
						tr.failures = append(tr.failures, err.Error())
					} else {
						tr.failures = append(tr.failures, res.Status+" from "+res.Header.Get("x-kvgate-endpoint"))
					}
					tr.mu.Unlock()
				}
				if res != nil {
					res.Body.Close()
				}
			}
		}()
	}
	t.Cleanup(tr.end)
	return tr
}

func (tr *traffic) end() {
	select {
	case <-tr.stop:
	default:
		close(tr.stop)
	}
	tr.wg.Wait()
}

func (tr *traffic) check(t *testing.T, min int64) {
	t.Helper()
	tr.end()
	t.Logf("traffic: %d requests, %d failed", tr.sent.Load(), tr.failed.Load())
	if tr.failed.Load() > 0 || tr.sent.Load() < min {
		t.Errorf("traffic: %d of %d requests failed (want 0 of >= %d): %v", tr.failed.Load(), tr.sent.Load(), min, tr.failures)
	}
}

// invKeys are the keys slot i holds in the inventory.
func invKeys(s *Server, i int) map[uint64]bool {
	out := map[uint64]bool{}
	var buf []uint64
	for cursor := uint64(0); ; {
		buf, cursor = s.kv.inv.Keys(i, cursor, 4096, buf[:0])
		for _, k := range buf {
			out[k] = true
		}
		if cursor == 0 {
			return out
		}
	}
}

// warm sends n requests of prefix while only endpoint name is up, so its engine caches
// the prefix and its events fill name's inventory.
func warm(t *testing.T, s *Server, name, prefix string, others ...string) {
	t.Helper()
	for _, o := range others {
		post(t, s.admURL("/admin/endpoints/"+o+"/down"), "")
	}
	for i := range 3 {
		res, body := post(t, s.url("/v1/completions"), complPrompt(prefix+fmt.Sprint(" turn ", i)))
		if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != name {
			t.Fatalf("warming %s: %d %s %s", name, res.StatusCode, res.Header.Get("x-kvgate-endpoint"), body)
		}
	}
	for _, o := range others {
		post(t, s.admURL("/admin/endpoints/"+o+"/up"), "")
	}
}

// The endpoints file is rewritten while requests flow: b leaves, c joins, a stays. No
// request fails; b drains, then gets no request and its inventory and slot are freed;
// c gets traffic and its events fill its inventory; a's inventory keys, hit count, slot
// and state are exactly as they were.
func TestFleetFileReloadUnderTraffic(t *testing.T) {
	a := launchSim(t, "a", "127.0.0.1:0", "tcp://127.0.0.1:0")
	b := launchSim(t, "b", "127.0.0.1:0", "tcp://127.0.0.1:0")
	c := launchSim(t, "c", "127.0.0.1:0", "tcp://127.0.0.1:0")
	file := filepath.Join(t.TempDir(), "endpoints")
	writeAtomic(t, file, "# the pool\n"+simSpec("a", a)+"\n"+simSpec("b", b)+" # leaves\n")
	cfg := kvConfig(t, KVConverged)
	eps, err := ReadEndpointsFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fleet.Endpoints, cfg.Fleet.EndpointsFile, cfg.Fleet.EndpointsWatch = eps, file, 20*time.Millisecond
	s, lb := startLogged(t, cfg, nil)
	ctx := context.Background()
	for _, sim := range []*enginesim.Sim{a, b} {
		if err := sim.WaitSubscribed(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	prefA := sharedPrefix + "Alpha."
	prefB := strings.Repeat("Bravo charlie delta echo foxtrot golf hotel india. ", 12)
	warm(t, s, "a", prefA, "b")
	warm(t, s, "b", prefB, "a")
	ia, ib := s.slotOf("a"), s.slotOf("b")
	waitFor(t, "a's and b's events", func() bool { return s.kv.inv.Count(ia) > 0 && s.kv.inv.Count(ib) > 0 })
	// A hit on a: its hit count is part of what a reload must not touch.
	if res, _ := post(t, s.url("/v1/completions"), complPrompt(prefA+" turn 0")); res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("a's prefix: route %s", res.Header.Get("x-kvgate-route"))
	}
	epA, keysA, hitsA := s.roster().eps[ia], invKeys(s, ia), s.m.hits[ia].Get()

	// Hits on a's and b's prefixes, and prompts no engine holds (placed by load).
	prefixes := []string{prefA, prefB, ""}
	tr := startTraffic(t, s, 4, func(w, i int) string {
		if p := prefixes[(w+i)%3]; p != "" {
			return p + fmt.Sprint(" q", w, "-", i%5)
		}
		return fmt.Sprint("Fresh ", w, "-", i, ": ") + sharedPrefix
	})
	time.Sleep(200 * time.Millisecond)
	writeAtomic(t, file, simSpec("a", a)+"\n"+simSpec("c", c)+"\n")
	waitFor(t, "c joined", func() bool { return s.slotOf("c") >= 0 })
	ic := s.slotOf("c")
	if err := c.WaitSubscribed(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b drained and freed", func() bool { return s.vacant(ib) })
	bDone := b.Stats().Requests
	waitForT(t, "c served and its events arrived", func() bool { return c.Stats().Requests > 0 && s.kv.inv.Count(ic) > 0 },
		func() string {
			return fmt.Sprintf("c: %+v keys %d status %+v", c.Stats(), s.kv.inv.Count(ic), s.kv.mgr.Status(ic))
		})
	time.Sleep(300 * time.Millisecond)
	tr.check(t, 20)

	if n := b.Stats().Requests; n != bDone {
		t.Errorf("b got %d requests after its drain", n-bDone)
	}
	if n := s.kv.inv.Count(ib); n != 0 {
		t.Errorf("b's slot still holds %d keys", n)
	}
	if s.roster().eps[ia] != epA || s.slotOf("a") != ia {
		t.Error("a's endpoint was replaced by a reload that did not change it")
	}
	now := invKeys(s, ia)
	for k := range keysA {
		if !now[k] {
			t.Fatalf("a lost key %x in the reload (had %d, has %d)", k, len(keysA), len(now))
		}
	}
	if h := s.m.hits[ia].Get(); h < hitsA {
		t.Errorf("a's hits went from %d to %d", hitsA, h)
	}
	if s.liveNames() != "a,c" {
		t.Errorf("fleet %s, want a,c", s.liveNames())
	}
	if len(lb.lines("fleet changed", "added=c", "removed=b")) != 1 || len(lb.lines("inventory and slot freed", "endpoint=b")) != 1 {
		t.Errorf("log:\n%s", lb.String())
	}
	_, metrics := get(t, s.admURL("/metrics"))
	if strings.Contains(metrics, `endpoint="b"`) || !strings.Contains(metrics, `kvgate_requests_total{endpoint="c"`) {
		t.Errorf("/metrics still names b or lacks c")
	}
}

// A reload that does not parse or validate is refused whole, with a WARN naming the
// file and line, and the running fleet stays as it was.
func TestFleetReloadRefusedWhole(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	dns := startDNS(t)
	file := filepath.Join(t.TempDir(), "endpoints")
	good := "name=a,url=" + a.url() + "\nname=b,url=" + b.url() + "\n"
	writeAtomic(t, file, good)
	cfg := testConfig()
	cfg.Fleet.Endpoints, _ = ReadEndpointsFile(file)
	cfg.Fleet.EndpointsFile, cfg.Fleet.EndpointsWatch = file, 10*time.Millisecond
	lb := &logBuf{}
	s := startWith(t, cfg, Options{Resolver: dns.resolver(), Logger: lb.logger()})
	for _, tc := range []struct{ content, want string }{
		{good + "name=c,url=ftp://x\n", file + ":3:"},
		{"name=a,url=" + a.url() + "\n\n# comment\nname=a,url=" + b.url() + "\n", "used twice (first on line 1)"},
		{good + "name=d,url=http://nowhere.test:80,discover=dns\n", file + `:3: endpoint`},
		{good + "name=e,url=http://127.0.0.1:1,role=prefill\n", "need -kv-mode 1"},
		{"name=a,url=" + a.url() + ",weight=0\n", file + ":1:"},
	} {
		before := len(lb.lines("-endpoints-file reload refused"))
		writeAtomic(t, file, tc.content)
		waitFor(t, "refusal of "+tc.want, func() bool { return len(lb.lines("-endpoints-file reload refused")) > before })
		if w := lb.lines("-endpoints-file reload refused"); !strings.Contains(w[len(w)-1], tc.want) {
			t.Errorf("WARN %q lacks %q", w[len(w)-1], tc.want)
		}
		if s.liveNames() != "a,b" {
			t.Fatalf("refused reload changed the fleet to %s", s.liveNames())
		}
		if res, body := post(t, s.url("/v1/completions"), `{"model":"m","prompt":"x"}`); res.StatusCode != 200 {
			t.Fatalf("after a refused reload: %d %s", res.StatusCode, body)
		}
	}
	// The validation error names the line of the endpoint it is about.
	writeAtomic(t, file, good+"name=f,url=http://127.0.0.1:1,replay=tcp://127.0.0.1:2\n")
	waitFor(t, "refusal naming line 3", func() bool { return len(lb.lines("reload refused", file+":3", "replay= without events=")) > 0 })
	// The refusal is visible until a change applies: a gauge and /debug/inventory.
	_, m := get(t, s.admURL("/metrics"))
	_, inv := get(t, s.admURL("/debug/inventory"))
	if !strings.Contains(m, "kvgate_fleet_change_refused 1") || !strings.Contains(m, `kvgate_fleet_changes_total{by="-endpoints-file",result="refused"} 6`) ||
		!strings.Contains(inv, `"last_refused": "-endpoints-file: `+file+`:3`) {
		t.Errorf("refusal not visible:\n%s\n%s", m, inv)
	}
	// Fixed: applied. The new roster shows while the change still holds the fleet's lock,
	// before it books the change, so the wait is for the books too.
	writeAtomic(t, file, "name=b,url="+b.url()+"\n")
	waitFor(t, "the good file applied", func() bool {
		_, m := get(t, s.admURL("/metrics"))
		return s.liveNames() == "b" && strings.Contains(m, `kvgate_fleet_changes_total{by="-endpoints-file",result="applied"}`)
	})
	if _, m := get(t, s.admURL("/metrics")); !strings.Contains(m, "kvgate_fleet_change_refused 0") ||
		!strings.Contains(m, `kvgate_fleet_changes_total{by="-endpoints-file",result="applied"} 1`) {
		t.Errorf("after the fix:\n%s", m)
	}
}

// POST and DELETE /admin/endpoints change the fleet through the same path as a reload;
// an added endpoint takes requests once its first health check passes, a removed one
// drains and gets none after.
func TestFleetAdminAddRemove(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	cfg := testConfig(a.url())
	cfg.Health.Interval, cfg.Health.Timeout = 100*time.Millisecond, time.Second
	cfg.Listener.AdminToken = "sekret"
	s := startProxy(t, cfg)
	auth := []string{"Authorization", "Bearer sekret"}
	if res, _ := post(t, s.admURL("/admin/endpoints"), "name=b,url="+b.url()); res.StatusCode != 401 {
		t.Fatalf("no token: %d", res.StatusCode)
	}
	res, body := post(t, s.admURL("/admin/endpoints"), "name=b,url="+b.url(), auth...)
	if res.StatusCode != 200 || !strings.Contains(body, `"added": "b"`) {
		t.Fatalf("add: %d %s", res.StatusCode, body)
	}
	waitFor(t, "b checked healthy", func() bool {
		e := s.roster().eps[max(s.slotOf("b"), 0)]
		return e.checked.Load() && e.healthy.Load()
	})
	for range 4 {
		post(t, s.url("/v1/completions"), `{"model":"m","prompt":"x"}`)
	}
	if b.count("/v1/completions") == 0 {
		t.Error("added endpoint got no requests")
	}
	for _, tc := range []struct {
		spec string
		code int
	}{
		{"name=b,url=" + b.url(), 409},
		{"name=z,url=ftp://x", 400},
		{"", 400},
		{"name=y,url=http://127.0.0.1:1\nname=w,url=http://127.0.0.1:2", 400},
	} {
		res, body := post(t, s.admURL("/admin/endpoints"), tc.spec, auth...)
		if res.StatusCode != tc.code {
			t.Errorf("POST %q: %d want %d (%s)", tc.spec, res.StatusCode, tc.code, body)
		}
		checkErrorBody(t, body, tc.code)
	}
	if s.liveNames() != "e0,b" {
		t.Fatalf("fleet %s after refused adds", s.liveNames())
	}
	del := func(name string) (*http.Response, string) {
		req, _ := http.NewRequest("DELETE", s.admURL("/admin/endpoints/"+name), nil)
		req.Header.Set(auth[0], auth[1])
		res, err := httpc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	ib := s.slotOf("b")
	if res, body := del("b"); res.StatusCode != 200 {
		t.Fatalf("delete: %d %s", res.StatusCode, body)
	}
	waitFor(t, "b freed", func() bool { return s.vacant(ib) })
	n := b.count("/v1/completions")
	for range 4 {
		if res, body := post(t, s.url("/v1/completions"), `{"model":"m","prompt":"x"}`); res.StatusCode != 200 {
			t.Fatalf("after delete: %d %s", res.StatusCode, body)
		}
	}
	if b.count("/v1/completions") != n {
		t.Error("removed endpoint still got requests")
	}
	if res, body := del("nope"); res.StatusCode != 404 {
		t.Errorf("delete unknown: %d %s", res.StatusCode, body)
	} else {
		checkErrorBody(t, body, 404)
	}
	// The last endpoint cannot go: a rule needs one.
	if res, body := del("e0"); res.StatusCode != 400 {
		t.Errorf("delete the last endpoint: %d %s", res.StatusCode, body)
	}
}

// testDNS is a tiny authoritative DNS server on 127.0.0.1 (UDP): A and AAAA answers
// from a table the test rewrites, NXDOMAIN for names it does not hold.
type testDNS struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	conn    *net.UDPConn
}

func startDNS(t *testing.T) *testDNS {
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	d := &testDNS{answers: map[string][]netip.Addr{}, conn: conn}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if resp := d.answer(buf[:n]); resp != nil {
				conn.WriteToUDP(resp, from)
			}
		}
	}()
	return d
}

func (d *testDNS) set(name string, addrs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if addrs == nil {
		delete(d.answers, name)
		return
	}
	var as []netip.Addr
	for _, a := range addrs {
		as = append(as, netip.MustParseAddr(a))
	}
	d.answers[name] = as
}

// resolver is a Go resolver that asks only this server.
func (d *testDNS) resolver() *net.Resolver {
	addr := d.conn.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "udp", addr)
	}}
}

// answer builds the reply to one query (RFC 1035 4.1): the question echoed, one answer
// record per address of the asked type, TTL 0.
func (d *testDNS) answer(q []byte) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return nil
	}
	i := 12
	var labels []string
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if i+1+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	i++ // the root label
	if i+4 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i : i+2])
	i += 4
	name := strings.ToLower(strings.Join(labels, "."))
	d.mu.Lock()
	addrs, known := d.answers[name]
	d.mu.Unlock()
	var ans []byte
	count := 0
	for _, a := range addrs {
		var rd []byte
		switch {
		case qtype == 1 && a.Is4():
			b := a.As4()
			rd = b[:]
		case qtype == 28 && a.Is6():
			b := a.As16()
			rd = b[:]
		default:
			continue
		}
		ans = append(ans, 0xc0, 12) // the name: a pointer to the question's
		ans = binary.BigEndian.AppendUint16(ans, qtype)
		ans = binary.BigEndian.AppendUint16(ans, 1) // IN
		ans = binary.BigEndian.AppendUint32(ans, 0) // TTL
		ans = binary.BigEndian.AppendUint16(ans, uint16(len(rd)))
		ans = append(ans, rd...)
		count++
	}
	flags := uint16(0x8580) // response, authoritative, recursion desired and available
	if !known {
		flags |= 3 // NXDOMAIN
	}
	out := append([]byte{}, q[0:2]...)
	out = binary.BigEndian.AppendUint16(out, flags)
	out = binary.BigEndian.AppendUint16(out, 1)
	out = binary.BigEndian.AppendUint16(out, uint16(count))
	out = binary.BigEndian.AppendUint16(out, 0)
	out = binary.BigEndian.AppendUint16(out, 0)
	out = append(out, q[12:i]...)
	return append(out, ans...)
}

// freePortOn finds a TCP port free on every one of hosts (loopback addresses), so
// engines on different addresses share it as a headless Service's pods do.
func freePortOn(t *testing.T, hosts ...string) int {
	for try := 0; try < 50; try++ {
		ln, err := net.Listen("tcp", hosts[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ok := true
		for _, h := range hosts[1:] {
			l2, err := net.Listen("tcp", fmt.Sprintf("%s:%d", h, port))
			if err != nil {
				ok = false
				break
			}
			l2.Close()
		}
		ln.Close()
		if ok {
			return port
		}
	}
	t.Fatal("no port free on every host")
	return 0
}

// A discover=dns endpoint follows its name's records while requests flow: an address
// that appears becomes an endpoint (traffic and events), one that goes drains and is
// freed; no request fails. A lookup that fails keeps the last answer.
func TestFleetDNSDiscovery(t *testing.T) {
	hosts := []string{"127.0.0.2", "127.0.0.3"}
	port, evPort := freePortOn(t, hosts...), freePortOn(t, hosts...)
	sims := map[string]*enginesim.Sim{}
	for _, h := range hosts {
		sims[h] = launchSim(t, h, fmt.Sprintf("%s:%d", h, port), fmt.Sprintf("tcp://%s:%d", h, evPort))
	}
	dns := startDNS(t)
	dns.set("pool.test", hosts[0])
	cfg := kvConfig(t, KVConverged, fmt.Sprintf("name=pool,url=http://pool.test:%d,engine=vllm,events=tcp://pool.test:%d,discover=dns", port, evPort))
	cfg.Fleet.DNSInterval = 30 * time.Millisecond
	lb := &logBuf{}
	s := startWith(t, cfg, Options{Resolver: dns.resolver(), Logger: lb.logger(), Tokenizers: sharedPool(t)})
	n2, n3 := "pool@"+hosts[0], "pool@"+hosts[1]
	if s.liveNames() != n2 {
		t.Fatalf("fleet %s, want %s", s.liveNames(), n2)
	}
	tr := startTraffic(t, s, 4, func(w, i int) string {
		if i%2 == 0 {
			return sharedPrefix + fmt.Sprint(" dns ", w, "-", i%7)
		}
		return fmt.Sprint("Fresh ", w, "-", i, ": ") + sharedPrefix
	})
	time.Sleep(200 * time.Millisecond)

	dns.set("pool.test", hosts...)
	waitFor(t, n3+" joined", func() bool { return s.slotOf(n3) >= 0 })
	i3 := s.slotOf(n3)
	waitFor(t, n3+" served and its events arrived", func() bool {
		return sims[hosts[1]].Stats().Requests > 0 && s.kv.inv.Count(i3) > 0
	})
	i2 := s.slotOf(n2)
	dns.set("pool.test", hosts[1])
	waitFor(t, n2+" drained and freed", func() bool { return s.vacant(i2) })
	done := sims[hosts[0]].Stats().Requests
	// The name vanishes (NXDOMAIN): the last answer stays.
	dns.set("pool.test")
	waitFor(t, "the failed lookup WARNed", func() bool { return len(lb.lines("discover=dns", "keeping the last answer")) > 0 })
	time.Sleep(200 * time.Millisecond)
	tr.check(t, 20)
	if n := sims[hosts[0]].Stats().Requests; n != done {
		t.Errorf("%s got %d requests after its drain", n2, n-done)
	}
	if s.liveNames() != n3 {
		t.Errorf("fleet %s, want %s", s.liveNames(), n3)
	}
}

// waitForT is waitFor that says more when it times out.
func waitForT(t *testing.T, what string, cond func() bool, more func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, more())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (l *logBuf) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// Slots are reused only once freed: with -max-endpoints 2 a third endpoint is refused
// while b drains; once b's slot is freed (keys cleared, series gone) c takes it and
// starts with nothing of b's: no keys, no hits, a fresh queue.
func TestFleetSlotReuse(t *testing.T) {
	c := vllmChain(t)
	a, b, d := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM), newKVEngine(t, "c", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""))
	cfg.Fleet.MaxEndpoints = 2
	cfg.KV.PendingTTL = 0 // what kvgate sent is not counted as held: only the engines' events
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	b.store(t, c, toks, 5)
	waitFor(t, "b's keys", func() bool { return s.kv.inv.Count(1) == 5 })
	if res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)); res.Header.Get("x-kvgate-endpoint") != "b" {
		t.Fatalf("b's prefix went to %s", res.Header.Get("x-kvgate-endpoint"))
	}
	if res, body := post(t, s.admURL("/admin/endpoints"), d.spec(0, "vllm", "")); res.StatusCode != 400 || !strings.Contains(body, "free slots") {
		t.Fatalf("add beyond -max-endpoints: %d %s", res.StatusCode, body)
	}
	if err := s.RemoveEndpoint("b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b freed", func() bool { return s.vacant(1) })
	if n := s.kv.inv.Count(1); n != 0 {
		t.Fatalf("freed slot holds %d keys", n)
	}
	if err := s.AddEndpoint(d.spec(0, "vllm", "")); err != nil {
		t.Fatal(err)
	}
	if i := s.slotOf("c"); i != 1 {
		t.Fatalf("c took slot %d, want the freed 1", i)
	}
	if s.m.hits[1].Get() != 0 || s.m.name(1) != "c" || s.queues.View(1, time.Now()).RateSamples != 0 {
		t.Errorf("c inherited b's state: hits %d name %s", s.m.hits[1].Get(), s.m.name(1))
	}
	res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") == "kv-hit" {
		t.Errorf("b's prefix after b left: %d %s %s", res.StatusCode, res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"))
	}
	d.store(t, c, toks, 3)
	waitFor(t, "c's keys in slot 1", func() bool { return s.kv.inv.Count(1) == 3 })
	if res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)); res.Header.Get("x-kvgate-endpoint") != "c" {
		t.Errorf("c's prefix went to %s", res.Header.Get("x-kvgate-endpoint"))
	}
	_, m := get(t, s.admURL("/metrics"))
	if strings.Contains(m, `endpoint="b"`) {
		t.Error("/metrics still names b")
	}
}

// A removed endpoint's in-flight stream runs to its end: the endpoint shows as draining
// and takes no new request meanwhile; its slot is freed only after the stream ended.
func TestFleetRemovalDrainsInFlight(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	release := make(chan struct{})
	b.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if !strings.Contains(string(body), `"stream":true`) {
			return false
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		io.WriteString(w, "data: {\"n\":0}\n\n")
		fl.Flush()
		<-release
		for i := 1; i < 5; i++ {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			fl.Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return true
	}
	s := startProxy(t, testConfig(b.url(), a.url()))
	ib := s.slotOf("e0")
	done := make(chan string, 1)
	started := make(chan struct{})
	go func() {
		res, err := httpc.Post(s.url("/v1/completions"), "application/json", strings.NewReader(`{"model":"m","prompt":"x","stream":true}`))
		if err != nil {
			close(started)
			done <- err.Error()
			return
		}
		defer res.Body.Close()
		r := bufio.NewReader(res.Body)
		var got strings.Builder
		for first := true; ; first = false {
			line, err := r.ReadString('\n')
			got.WriteString(line)
			if first {
				close(started)
			}
			if err != nil {
				break
			}
		}
		done <- got.String()
	}()
	<-started
	if s.loads.Get(ib) != 1 {
		t.Fatalf("the stream is not on e0: in flight %d", s.loads.Get(ib))
	}
	if err := s.RemoveEndpoint("e0"); err != nil {
		t.Fatal(err)
	}
	_, inv := get(t, s.admURL("/debug/inventory"))
	if !strings.Contains(inv, `"draining": true`) || !strings.Contains(inv, `"draining": 1`) {
		t.Errorf("e0 not shown draining:\n%s", inv)
	}
	n := b.count("/v1/completions")
	for range 4 {
		if res, body := post(t, s.url("/v1/completions"), `{"model":"m","prompt":"y"}`); res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != "e1" {
			t.Fatalf("while e0 drains: %d %s %s", res.StatusCode, res.Header.Get("x-kvgate-endpoint"), body)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if s.vacant(ib) || b.count("/v1/completions") != n {
		t.Fatalf("e0 freed (%v) or sent new requests (%d) while its stream runs", s.vacant(ib), b.count("/v1/completions")-n)
	}
	close(release)
	got := <-done
	if strings.Count(got, "data: ") != 6 || !strings.Contains(got, "[DONE]") {
		t.Errorf("the draining stream was cut: %q", got)
	}
	waitFor(t, "e0 freed after its stream", func() bool { return s.vacant(ib) })
}

// A discover=dns template's endpoint at an address: the URL's and the event sockets'
// host (when it is the template's name) become the address, port and options stay.
func TestDiscoverEndpointAt(t *testing.T) {
	tpl, err := ParseEndpoint("name=pool,url=https://vllm.ns.svc:8443,engine=sglang,events=tcp://vllm.ns.svc:5557,replay=tcp://other:5558,weight=3,discover=dns")
	if err != nil {
		t.Fatal(err)
	}
	e := tpl.at(netip.MustParseAddr("fd00::7"))
	if e.Name != "pool@fd00::7" || e.URL != "https://[fd00::7]:8443" || e.Host() != "[fd00::7]:8443" ||
		e.Events != "tcp://[fd00::7]:5557" || e.Replay != "tcp://other:5558" || e.Weight != 3 || e.Engine != EngineSGLang || e.Discover {
		t.Errorf("%+v", e)
	}
	for _, bad := range []string{"name=p,url=http://10.0.0.1:80,discover=dns", "name=p,url=http://x:80,discover=srv"} {
		if _, err := ParseEndpoint(bad); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

// Mode 1 takes fleet changes too: a prefill endpoint added at runtime is in the prefill
// role set (and a removed one leaves it), while a change that would leave no prefill
// endpoint is refused whole.
func TestFleetPDRoles(t *testing.T) {
	p1, p2, dec := newKVEngine(t, "p1", enginepub.VLLM), newKVEngine(t, "p2", enginepub.VLLM), newKVEngine(t, "d1", enginepub.VLLM)
	prefill := func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":`+vllmKTP+`}`)
		return true
	}
	p1.handle, p2.handle = prefill, prefill
	s := startProxy(t, kvConfig(t, KVDisaggregated, p1.spec(0, "vllm", ",role=prefill"), dec.spec(1, "vllm", ",role=decode")))
	if err := s.RemoveEndpoint("p1"); err == nil || !strings.Contains(err.Error(), "role=prefill") {
		t.Fatalf("removing the only prefill endpoint: %v", err)
	}
	if err := s.AddEndpoint(p2.spec(0, "vllm", ",role=prefill")); err != nil {
		t.Fatal(err)
	}
	i2 := s.slotOf("p2")
	if !s.roster().prefillMask.Has(i2) || s.roster().decodeMask.Has(i2) {
		t.Fatal("p2 not in the prefill role set")
	}
	if err := s.RemoveEndpoint("p1"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		body := fmt.Sprintf(`{"model":"qwen3","messages":[{"role":"user","content":"hello %d"}],"max_tokens":5}`, i)
		res, out := post(t, s.url("/v1/chat/completions"), body)
		if res.StatusCode != 200 || res.Header.Get("x-kvgate-prefill") != "p2" || res.Header.Get("x-kvgate-endpoint") != "d1" {
			t.Fatalf("after the swap: %d prefill=%s decode=%s %s", res.StatusCode, res.Header.Get("x-kvgate-prefill"), res.Header.Get("x-kvgate-endpoint"), out)
		}
	}
	if s.roster().prefillMask.Has(0) {
		t.Error("p1's slot still in the prefill role set")
	}
}

// A data-parallel endpoint's rank slots are laid out at start (ranks.go): one added at
// runtime is refused whole, naming it, and the fleet stays as it was.
func TestFleetRefusesRuntimeDP(t *testing.T) {
	cfg := kvConfig(t, KVConverged, "name=a,url=http://127.0.0.1:1,engine=vllm,events=tcp://127.0.0.1:2")
	s, err := New(cfg, Options{Logger: quietLog, Tokenizers: sharedPool(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = s.AddEndpoint("name=b,url=http://127.0.0.1:3,engine=vllm,events=tcp://127.0.0.1:4,dp=2")
	if err == nil || !strings.Contains(err.Error(), `"b"`) || !strings.Contains(err.Error(), "dp=2") {
		t.Fatalf("runtime dp=2: %v", err)
	}
	if got := s.Endpoints(); len(got) != 1 || got[0].Name != "a" {
		t.Fatalf("fleet changed: %+v", got)
	}
	if err := s.AddEndpoint("name=c,url=http://127.0.0.1:5,engine=vllm,events=tcp://127.0.0.1:6"); err != nil {
		t.Fatalf("one rank: %v", err)
	}
}
