package ingest

import (
	"bytes"
	"context"
	"encoding/hex"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kvgate/kvgate/engine"
)

// recordingHandler keeps every log record's message and attributes.
type recordingHandler struct {
	mu   sync.Mutex
	recs []string
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.Key + "=" + a.Value.String())
		return true
	})
	h.mu.Lock()
	h.recs = append(h.recs, b.String())
	h.mu.Unlock()
	return nil
}

// warns returns the WARN records that contain s.
func (h *recordingHandler) warns(s string) []string {
	var out []string
	for _, r := range h.matching(s) {
		if strings.HasPrefix(r, "WARN ") {
			out = append(out, r)
		}
	}
	return out
}

func (h *recordingHandler) matching(s string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if strings.Contains(r, s) {
			out = append(out, r)
		}
	}
	return out
}

func goldenPayload(t *testing.T, name string) []byte {
	t.Helper()
	for _, g := range loadBatches(t) {
		if g.Name == name {
			p, err := hex.DecodeString(g.Payload)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	t.Fatalf("no golden batch %q", name)
	return nil
}

// TestBadEventCostsOnlyItself applies the Python-built batches whose middle events do not
// decode: the stores before them and the removals after them reach the inventory (a lost
// BlockRemoved would leave a stale key), each skipped event is counted by its reason on
// the status and /metrics, and the WARN is rate-limited to one per interval.
func TestBadEventCostsOnlyItself(t *testing.T) {
	inv := newInv(t)
	logs := &recordingHandler{}
	set := metrics.NewSet()
	cfg := testConfig(inv)
	cfg.Logger, cfg.Metrics = slog.New(logs), set
	m, err := NewManager(cfg, []EndpointConfig{
		{Name: "v", Index: 0, Engine: "vllm", Events: "tcp://127.0.0.1:1"},
		{Name: "s", Index: 1, Engine: "sglang", Events: "tcp://127.0.0.1:2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	av, as := newApplier(m.eps[0], m.eps[0].rk[0]), newApplier(m.eps[1], m.eps[1].rk[0])

	// vLLM: stored [1], 4 bad events, removed [1]; then a store of [9] alone.
	if err := av.apply(goldenPayload(t, "bad-event-mid-batch-vllm")); err != nil {
		t.Fatalf("a batch with bad events failed whole: %v", err)
	}
	if got := invKeys(inv, 0); len(got) != 0 {
		t.Fatalf("the removal after the bad events was lost: inventory %v", got)
	}
	st := m.Status(0)
	if st.EventsStored != 1 || st.EventsRemoved != 1 || st.DecodeErrors != 0 ||
		st.BadEvents["type"] != 2 || st.BadEvents["range"] != 2 {
		t.Fatalf("status %+v", st)
	}
	// SGLang: 4 bad events, then the removal of a key stored before.
	inv.Add(1, []uint64{uint64(-1 & 0xffffffffffffffff), 5})
	if err := as.apply(goldenPayload(t, "bad-event-mid-batch-sglang")); err != nil {
		t.Fatal(err)
	}
	if got := invKeys(inv, 1); !slices.Equal(got, []uint64{0xffffffffffffffff}) {
		t.Fatalf("sglang inventory %v, want only the key not removed", got)
	}
	if st := m.Status(1); st.BadEvents["type"] != 4 || st.EventsRemoved != 1 {
		t.Fatalf("sglang status %+v", st)
	}
	// Again: counted, but no second WARN within the interval.
	av.apply(goldenPayload(t, "bad-event-mid-batch-vllm"))
	if st := m.Status(0); st.BadEvents["type"] != 4 {
		t.Fatalf("second batch: %+v", st.BadEvents)
	}
	warns := logs.matching("does not decode")
	if len(warns) != 2 || !strings.Contains(warns[0], "endpoint=v") || !strings.Contains(warns[1], "endpoint=s") {
		t.Fatalf("want one WARN per endpoint, got %q", warns)
	}
	var buf bytes.Buffer
	set.WritePrometheus(&buf)
	for _, want := range []string{`kvgate_ingest_bad_events_total{endpoint="v",reason="type"} 4`,
		`kvgate_ingest_bad_events_total{endpoint="v",reason="range"} 4`,
		`kvgate_ingest_bad_events_total{endpoint="s",reason="type"} 4`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// FuzzBadEventIsolation puts one fuzzed msgpack value between two good events of an
// array batch. Whatever it holds, if it is exactly one well-formed value the events
// around it decode exactly as without it, and it comes back as one event.
func FuzzBadEventIsolation(f *testing.F) {
	for _, g := range loadBatches(f) {
		if g.Error {
			continue
		}
		p, _ := hex.DecodeString(g.Payload)
		var d BatchDecoder
		if d.Reset(p) != nil {
			continue
		}
		// Seed with every golden event's own bytes.
		for {
			start := d.r.off
			var ev Event
			if !d.Next(&ev) {
				break
			}
			f.Add(slices.Clone(p[start:d.r.off]), g.Flavor == "sglang")
		}
	}
	f.Add([]byte{0x91, 0xc1}, false)
	first := []byte("\x93\xabBlockStored\x92\x01\x02\xc0") // [BlockStored, [1,2], nil]
	last := []byte("\x92\xacBlockRemoved\x91\x07")         // [BlockRemoved, [7]]
	f.Fuzz(func(t *testing.T, mid []byte, sglang bool) {
		var one reader
		one.reset(mid)
		one.skip()
		if one.err != nil || one.off != len(mid) {
			return // not exactly one value: the batch's structure would be broken
		}
		p := append([]byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x93}, first...)
		p = append(append(append(p, mid...), last...), 0x00)
		d := BatchDecoder{}
		if sglang {
			d.Engine = engine.SGLang
		}
		if err := d.Reset(p); err != nil {
			t.Fatal(err)
		}
		var ev Event
		if !d.Next(&ev) || ev.Kind != EventStored || !slices.Equal(ev.Hashes, []uint64{1, 2}) {
			t.Fatalf("first event %+v err %v", ev, d.Err())
		}
		if !d.Next(&ev) {
			t.Fatalf("the fuzzed event stopped the batch: %v", d.Err())
		}
		if ev.Kind == EventInvalid && (len(ev.Hashes) != 0 || len(ev.Tokens) != 0 || ev.Bad == BadNone) {
			t.Fatalf("invalid event carries data: %+v", ev)
		}
		if !d.Next(&ev) || ev.Kind != EventRemoved || !slices.Equal(ev.Hashes, []uint64{7}) {
			t.Fatalf("last event %+v err %v", ev, d.Err())
		}
		if d.Next(&ev) {
			t.Fatal("a fourth event")
		}
		if rank, err := d.Finish(); err != nil || rank != 0 {
			t.Fatalf("finish %d %v", rank, err)
		}
	})
}
