package ingest

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// TestSilentPeerDoesNotBlockClose: a peer that accepts TCP but never speaks ZMTP would
// block zmq4's Dial forever; the subscriber gives up after DialTimeout, keeps retrying,
// and Close returns. Once the peer goes away nothing is left running.
func TestSilentPeerDoesNotBlockClose(t *testing.T) {
	base, _ := liveGoroutines()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	inv := newInv(t)
	cfg := testConfig(inv)
	cfg.DialTimeout = 100 * time.Millisecond
	m, err := NewManager(cfg, []EndpointConfig{{Name: "silent", Engine: "vllm", Events: "tcp://" + l.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(t.Context())
	waitFor(t, "dial timeouts", func() bool { return m.Status(0).DialFailures >= 2 })
	done := make(chan struct{})
	go func() { m.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close blocked on a silent peer")
	}
	if m.Status(0).Connected {
		t.Fatal("connected to a peer that never greeted")
	}
	l.Close()
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	settleGoroutines(t, base)
}

// TestConfigErrors: bad endpoints are refused with a message naming the problem.
func TestConfigErrors(t *testing.T) {
	inv := newInv(t)
	for _, c := range []struct {
		ep   EndpointConfig
		want string
	}{
		{EndpointConfig{Name: "l", Engine: "llamacpp", URL: "http://127.0.0.1:1"}, "chwbl"},
		{EndpointConfig{Name: "x", Engine: "tgi"}, "no event contract"},
		{EndpointConfig{Name: "w", Engine: "vllm", Events: "tcp://*:5557"}, "wildcard"},
		{EndpointConfig{Name: "p", Engine: "vllm", Events: "127.0.0.1:5557"}, "tcp://"},
		{EndpointConfig{Name: "t", Engine: "trtllm", URL: "ftp://x"}, "http"},
		{EndpointConfig{Name: "", Engine: "vllm", Events: "tcp://127.0.0.1:1"}, "name"},
	} {
		_, err := NewManager(testConfig(inv), []EndpointConfig{c.ep})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want it to mention %q", c.ep, err, c.want)
		}
	}
	_, err := NewManager(testConfig(inv), []EndpointConfig{
		{Name: "a", Engine: "vllm", Events: "tcp://127.0.0.1:1"},
		{Name: "b", Engine: "vllm", Events: "tcp://127.0.0.1:2"},
	})
	if err == nil || !strings.Contains(err.Error(), "share inventory slot") {
		t.Errorf("shared index: %v", err)
	}
	for in, want := range map[string]KeyMode{"": KeysAuto, "auto": KeysAuto, "engine": KeysEngine, "rehash": KeysRehash} {
		if got, err := ParseKeyMode(in); err != nil || got != want {
			t.Errorf("ParseKeyMode(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseKeyMode("both"); err == nil {
		t.Error("ParseKeyMode accepted junk")
	}
	if m, err := parseMedia("gpu, cpu"); err != nil || !m.Has(MediumGPU) || !m.Has(MediumCPU) || m.Has(MediumStorage) {
		t.Errorf("parseMedia: %v %v", m, err)
	}
}

// TestMetricsExposed: per-endpoint series appear in the VictoriaMetrics set.
func TestMetricsExposed(t *testing.T) {
	inv := newInv(t)
	set := metrics.NewSet()
	cfg := testConfig(inv)
	cfg.Metrics = set
	addr := freeAddr(t, 1)
	pub := newPub(t, enginepub.Config{Endpoint: addr})
	m := startManager(t, cfg, EndpointConfig{Name: `gpu-"a"`, Engine: "vllm", Events: addr})
	waitSubscribed(t, pub)
	pub.Publish(stored(1, 2, 3))
	waitFor(t, "batch", func() bool { return m.Status(0).Keys == 3 })
	var buf bytes.Buffer
	set.WritePrometheus(&buf)
	out := buf.String()
	for _, want := range []string{
		`kvgate_ingest_connected{endpoint="gpu-_a_"} 1`,
		`kvgate_ingest_batches_total{endpoint="gpu-_a_"} 1`,
		`kvgate_ingest_events_total{endpoint="gpu-_a_",type="stored"} 1`,
		`kvgate_ingest_keys_added_total{endpoint="gpu-_a_"} 3`,
		`kvgate_ingest_inventory_keys{endpoint="gpu-_a_"} 3`,
		`kvgate_ingest_parity{endpoint="gpu-_a_"} 0`,
		`kvgate_ingest_tier_blocks{endpoint="gpu-_a_",medium="GPU"} 3`,
		`kvgate_ingest_gaps_total{endpoint="gpu-_a_",action="cleared"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s\n%s", want, out)
		}
	}
}

// TestConfigErrorsNameTheField: each refused endpoint is a *FieldError blaming the field
// to fix and the endpoint it belongs to.
func TestConfigErrorsNameTheField(t *testing.T) {
	inv := newInv(t)
	for _, c := range []struct {
		eps   []EndpointConfig
		name  string
		field string
	}{
		{[]EndpointConfig{{Name: "", Engine: "vllm", Events: "tcp://127.0.0.1:1"}}, "", FieldName},
		{[]EndpointConfig{{Name: "n", Index: -1, Engine: "vllm", Events: "tcp://127.0.0.1:1"}}, "n", FieldIndex},
		{[]EndpointConfig{{Name: "l", Engine: "llamacpp", URL: "http://127.0.0.1:1"}}, "l", FieldEngine},
		{[]EndpointConfig{{Name: "x", Engine: "tgi"}}, "x", FieldEngine},
		{[]EndpointConfig{{Name: "w", Engine: "vllm", Events: "tcp://*:5557"}}, "w", FieldEvents},
		{[]EndpointConfig{{Name: "r", Engine: "sglang", Events: "tcp://127.0.0.1:1", Replay: "127.0.0.1:2"}}, "r", FieldReplay},
		{[]EndpointConfig{{Name: "t", Engine: "trtllm", URL: "ftp://x"}}, "t", FieldURL},
		{[]EndpointConfig{
			{Name: "a", Engine: "vllm", Events: "tcp://127.0.0.1:1"},
			{Name: "a", Index: 1, Engine: "vllm", Events: "tcp://127.0.0.1:2"},
		}, "a", FieldName},
		{[]EndpointConfig{
			{Name: "a", Engine: "vllm", Events: "tcp://127.0.0.1:1"},
			{Name: "b", Engine: "vllm", Events: "tcp://127.0.0.1:2"},
		}, "b", FieldIndex},
	} {
		_, err := NewManager(testConfig(inv), c.eps)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || fe.Endpoint != c.name || fe.Error() != err.Error() {
			t.Errorf("%+v: err %v (%T); want a *FieldError blaming %s of %q", c.eps, err, err, c.field, c.name)
		}
	}
}
