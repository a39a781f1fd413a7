package proxy

import (
	"bytes"
	"log/slog"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBreakerStates(t *testing.T) {
	now := time.Unix(1000, 0)
	b := NewBreaker(3, 10*time.Second, 1, 2)
	b.now = func() time.Time { return now }
	for i := 0; i < 2; i++ {
		b.Failure()
	}
	if b.State() != BreakerClosed || !b.Ready() {
		t.Fatal("opened before the threshold")
	}
	b.Success() // a success resets the streak
	b.Failure()
	b.Failure()
	if b.State() != BreakerClosed {
		t.Fatal("streak not reset by success")
	}
	b.Failure()
	if b.State() != BreakerOpen || b.Ready() || b.Allow() {
		t.Fatal("not open after 3 consecutive failures")
	}
	now = now.Add(9 * time.Second)
	if b.Allow() {
		t.Fatal("admitted while open")
	}
	now = now.Add(time.Second)
	if b.State() != BreakerHalfOpen || !b.Allow() {
		t.Fatal("no half-open trial after the open period")
	}
	if b.Allow() || b.Ready() {
		t.Fatal("more trials than configured")
	}
	b.Failure() // the trial failed: open again
	if b.State() != BreakerOpen {
		t.Fatal("failed trial did not reopen")
	}
	now = now.Add(10 * time.Second)
	if !b.Allow() {
		t.Fatal("no trial")
	}
	b.Neutral() // client left: slot released, still half-open
	if !b.Allow() {
		t.Fatal("slot not released")
	}
	b.Success()
	if b.State() != BreakerClosed {
		t.Fatal("successful trial did not close")
	}
	// 5xx streak (configured 2).
	b.FiveXX()
	if b.State() != BreakerClosed {
		t.Fatal("opened on one 5xx")
	}
	b.FiveXX()
	if b.State() != BreakerOpen {
		t.Fatal("5xx streak did not open")
	}
	// 5xx do not count without a configured streak.
	c := NewBreaker(1, time.Second, 1, 0)
	for i := 0; i < 10; i++ {
		c.FiveXX()
	}
	if c.State() != BreakerClosed {
		t.Fatal("5xx opened a breaker without -breaker-5xx")
	}
}

func TestAffinityTTLAndLRU(t *testing.T) {
	a := newAffinity(time.Minute, 2)
	now := time.Unix(0, 0)
	a.put([]byte("s1"), 1, 2, now)
	a.put([]byte("s2"), 3, 4, now)
	if p, d, ok := a.get([]byte("s1"), now); !ok || p != 1 || d != 2 {
		t.Fatal("s1 missing")
	}
	a.put([]byte("s3"), 5, 6, now) // evicts s2, the least recently used
	if _, _, ok := a.get([]byte("s2"), now); ok {
		t.Error("LRU bound not applied")
	}
	if _, _, ok := a.get([]byte("s1"), now.Add(2*time.Minute)); ok {
		t.Error("expired entry returned")
	}
	if a.len() != 1 {
		t.Errorf("len %d", a.len())
	}
}

func TestParseEndpointAndValidate(t *testing.T) {
	e, err := ParseEndpoint("name=p0,url=http://10.0.0.1:8000/,engine=sglang,role=prefill,events=tcp://10.0.0.1:5557,dp=2,weight=3,down=true,bootstrap_port=8998")
	if err != nil || e.Name != "p0" || e.URL != "http://10.0.0.1:8000" || e.Engine != EngineSGLang || e.Role != RolePrefill || e.DP != 2 || e.Weight != 3 || !e.Down || e.BootstrapPort != 8998 {
		t.Fatalf("%+v %v", e, err)
	}
	for _, bad := range []string{"name=x", "url=ftp://h:1", "url=http://h:1/v1", "url=http://h:1,engine=tgi", "url=http://h:1,role=x", "url=http://h:1,dp=0", "url=http://h:1,bogus=1", "url=http://h:1,weight",
		`name=a"b,url=http://h:1`, `name=a\b,url=http://h:1`, "name=a\tb,url=http://h:1", "name=a\x7fb,url=http://h:1"} {
		if _, err := ParseEndpoint(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	cases := []struct {
		mutate func(*Config)
		flag   string
	}{
		{func(c *Config) { c.Fleet.Endpoints = nil }, "-endpoint"},
		{func(c *Config) { c.Fleet.Endpoints = append(c.Fleet.Endpoints, c.Fleet.Endpoints[0]) }, "-endpoint"},
		{func(c *Config) { c.KV.Mode = KVConverged }, "-endpoint"}, // no events=
		{func(c *Config) { c.Fleet.Endpoints[0].Role = RolePrefill }, "-kv-mode"},
		{func(c *Config) { c.KV.LoadFactor = -1 }, "-kv-load-factor"},
		{func(c *Config) { c.KV.FairShare = 0.8 }, "-kv-fair-share"},
		{func(c *Config) {
			c.KV.Mode, c.Fleet.Endpoints[0].Events, c.Fleet.Endpoints[0].DP = KVConverged, "tcp://127.0.0.1:2", 2
			c.Plane.Kind, c.Plane.NATSURL = "jetstream", "nats://127.0.0.1:1"
		}, "-events-plane"},
		{func(c *Config) { c.KV.FairShare = math.NaN() }, "-kv-fair-share"},
		{func(c *Config) { c.Breaker.Failures = 0 }, "-breaker-failures"},
		{func(c *Config) { c.Limits.MaxBodyBytes = 10 }, "-max-body-bytes"},
		{func(c *Config) { c.Upstream.Timeout = 0 }, "-upstream-timeout"},
		{func(c *Config) { c.Models.LoRA = map[string]string{"a": "nobase"} }, "-lora"},
		{func(c *Config) { c.Models.Tokenizers = []TokenizerSpec{{Model: "m", Dir: "/nonexistent"}} }, "-tokenizer"},
	}
	for i, tc := range cases {
		cfg := testConfig("http://127.0.0.1:1")
		tc.mutate(&cfg)
		err := cfg.Validate()
		fe, ok := err.(*FlagError)
		if !ok || fe.Flag != tc.flag {
			t.Errorf("case %d: %v, want refusal naming %s", i, err, tc.flag)
		}
	}
}

// Far fewer delivered cached tokens than predicted means the tokenizer or template
// differs from the engine's: kvgate says so.
func TestReceiptGapWarns(t *testing.T) {
	var buf bytes.Buffer
	s, err := New(testConfig("http://127.0.0.1:1"), Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	d := decision{ep: 0, decode: -1, predicted: 128}
	for i := 0; i < 19; i++ {
		s.recordReceipt(&d, 0, 200)
	}
	if buf.Len() != 0 {
		t.Fatalf("warned early: %s", buf.String())
	}
	s.recordReceipt(&d, 0, 200)
	if !strings.Contains(buf.String(), "tokenizer, chat template or hash settings likely differ") {
		t.Errorf("no gap warning: %q", buf.String())
	}
	buf.Reset()
	good := decision{ep: 0, decode: -1, predicted: 128}
	s2, _ := New(testConfig("http://127.0.0.1:1"), Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	for i := 0; i < 40; i++ {
		s2.recordReceipt(&good, 120, 200)
	}
	if buf.Len() != 0 {
		t.Errorf("warned on a healthy ratio: %s", buf.String())
	}
}

func TestReadEndpointsFile(t *testing.T) {
	p := t.TempDir() + "/eps"
	os.WriteFile(p, []byte("# pool\nname=a,url=http://127.0.0.1:1\n\n  name=b,url=http://127.0.0.1:2,weight=2  \n"), 0o644)
	eps, err := ReadEndpointsFile(p)
	if err != nil || len(eps) != 2 || eps[1].Name != "b" || eps[1].Weight != 2 {
		t.Fatalf("%+v %v", eps, err)
	}
	os.WriteFile(p, []byte("name=a,url=http://127.0.0.1:1\nname=b,bad\n"), 0o644)
	if _, err := ReadEndpointsFile(p); err == nil || !strings.Contains(err.Error(), ":2:") {
		t.Errorf("bad line not reported with its number: %v", err)
	}
}

// Validate checks and changes nothing: shorthands (an endpoint built by hand from a URL,
// -kv-keys fast) are filled in by normalize, which New runs on its own copy.
func TestValidateDoesNotMutate(t *testing.T) {
	cfg := Defaults()
	cfg.Fleet.Endpoints = []EndpointSpec{{URL: "http://127.0.0.1:7001"}, {Name: "b", URL: "http://127.0.0.1:7002"}}
	cfg.KV.Keys = "fast"
	before := cfg
	before.Fleet.Endpoints = slices.Clone(cfg.Fleet.Endpoints)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, before) {
		t.Fatalf("Validate changed the config:\n%+v\nwas\n%+v", cfg, before)
	}
	n := cfg
	n.normalize()
	if n.KV.Keys != "rehash" || n.Fleet.Endpoints[0].host != "127.0.0.1:7001" || n.Fleet.Endpoints[0].Name == "" {
		t.Fatalf("normalize: %+v", n)
	}
	if cfg.Fleet.Endpoints[0].host != "" {
		t.Fatal("normalize wrote into the caller's endpoint list")
	}
}

// A half-open trial whose outcome is never booked (an answer no path judges, a panic)
// gives its slot back one open period after it was claimed: the breaker must not stay
// half-open with no trial left, refusing a recovered engine for good.
func TestBreakerLostTrialFreed(t *testing.T) {
	now := time.Unix(1000, 0)
	b := NewBreaker(1, 10*time.Second, 1, 2)
	b.now = func() time.Time { return now }
	b.Failure()
	now = now.Add(10 * time.Second)
	if !b.Allow() {
		t.Fatal("no trial after the open period")
	}
	now = now.Add(9 * time.Second)
	if b.Allow() || b.Ready() {
		t.Fatal("a second trial while the first may still be running")
	}
	now = now.Add(time.Second)
	if !b.Ready() || !b.Allow() {
		t.Fatal("the lost trial's slot was never given back")
	}
	b.Success()
	if b.State() != BreakerClosed {
		t.Fatalf("state %v after the new trial's success, want closed", b.State())
	}
}
