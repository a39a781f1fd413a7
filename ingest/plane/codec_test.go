package plane

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/shard"
)

// The header layout is checked byte by byte against encoding/binary, not against
// appendMsg's own reader.
func TestWireLayout(t *testing.T) {
	keys := []uint64{1, 1 << 63, 0xdeadbeefcafebabe}
	b := appendMsg(nil, header{op: OpSnapshot, kind: kindFast, epoch: 0x0102030405060708, seq: 42, chunk: 1, chunks: 3}, keys)
	if len(b) != headerLen+8*len(keys) || b[0] != 'K' || b[1] != 1 || b[2] != 4 || b[3] != 1 {
		t.Fatalf("header % x", b[:4])
	}
	le := binary.LittleEndian
	if le.Uint32(b[4:]) != 3 || le.Uint64(b[8:]) != 0x0102030405060708 || le.Uint64(b[16:]) != 42 || le.Uint32(b[24:]) != 1 || le.Uint32(b[28:]) != 3 {
		t.Fatalf("header % x", b[:headerLen])
	}
	for i, k := range keys {
		if le.Uint64(b[headerLen+8*i:]) != k {
			t.Fatalf("key %d", i)
		}
	}
	var h header
	if err := parseHeader(b, &h); err != nil {
		t.Fatal(err)
	}
	if h.op != OpSnapshot || h.kind != kindFast || h.n != 3 || h.seq != 42 || h.chunk != 1 || h.chunks != 3 {
		t.Fatalf("%+v", h)
	}
	if got := appendKeys(nil, b); !slices.Equal(got, keys) {
		t.Fatalf("keys %v", got)
	}
}

func TestWireRejectsBadMessages(t *testing.T) {
	good := appendMsg(nil, header{op: OpStore, epoch: 1, seq: 1}, []uint64{7, 8})
	mut := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "shorter"},
		{"short", good[:10], "shorter"},
		{"magic", mut(func(b []byte) []byte { b[0] = 'X'; return b }), "magic"},
		{"version", mut(func(b []byte) []byte { b[1] = 9; return b }), "version"},
		{"op", mut(func(b []byte) []byte { b[2] = 0; return b }), "unknown op"},
		{"kind", mut(func(b []byte) []byte { b[3] = 7; return b }), "key kind"},
		{"truncated keys", good[:len(good)-3], "carries"},
		{"extra bytes", append(slices.Clone(good), 0), "carries"},
		{"count lies", mut(func(b []byte) []byte { b[4] = 200; return b }), "says 200 keys"},
		{"snapshot chunk", appendMsg(nil, header{op: OpSnapshot, chunk: 2, chunks: 2}, nil), "chunk 2 of 2"},
		{"snapshot no chunks", appendMsg(nil, header{op: OpSnapshot}, nil), "chunk 0 of 0"},
	} {
		var h header
		err := parseHeader(tc.b, &h)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestSubjectToken(t *testing.T) {
	for in, want := range map[string]string{
		"a": "a", "gpu-0_x": "gpu-0_x", "b.dotted name": "b%2Edotted%20name", "*>": "%2A%3E", "é": "%C3%A9",
	} {
		if got := subjectToken(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
	s := subjectsFor("kvgate.kv", "x.y")
	if s.events != "kvgate.kv.x%2Ey.ev" || s.head != "kvgate.kv.x%2Ey.snap" || s.filter != "kvgate.kv.x%2Ey.*" || s.req != "kvgate.kv_req.x%2Ey" {
		t.Fatalf("%+v", s)
	}
}

func TestConfigRefusals(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "-nats-url"},
		{Config{URL: "http://x:1"}, "nats://"},
		{Config{URL: "nats://x:1", Stream: "a.b"}, "stream name"},
		{Config{URL: "nats://x:1", Prefix: "a.*"}, "prefix"},
		{Config{URL: "nats://x:1", MaxAge: 10e9, SnapshotInterval: 30e9}, "twice"},
	} {
		c := tc.cfg
		if err := c.defaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := NewRoute(Config{URL: "nats://x:1"}, newInv(t), []Endpoint{{Name: "a"}, {Name: "a", Index: 1}}); err == nil {
		t.Error("duplicate endpoint name accepted")
	}
	if _, err := ParseRole("leader"); err == nil {
		t.Error("bad role accepted")
	}
}

// offlineRoute is a route replica whose consumer state is driven by hand (no NATS): the
// state machine's rules, message by message.
func offlineRoute(t *testing.T) (*Route, *subEndpoint) {
	t.Helper()
	r, err := NewRoute(Config{URL: "nats://127.0.0.1:1"}, newInv(t), []Endpoint{{Name: "a", Index: 0, Engine: engine.VLLM}})
	if err != nil {
		t.Fatal(err)
	}
	r.up.Store(true)
	return r, r.eps[0]
}

func TestRouteStateMachine(t *testing.T) {
	r, e := offlineRoute(t)
	inv := r.inv
	msg := func(h header, keys ...uint64) []byte { return appendMsg(nil, h, keys) }
	state := func() string { s, _ := r.State(0); return s }
	// Ops before any snapshot are ignored: their base is unknown.
	gen := r.KeyGen()
	e.apply(msg(header{op: OpStore, epoch: 5, seq: 1}, 1, 2))
	if inv.Count(0) != 0 || state() != StateSyncing {
		t.Fatalf("op before snapshot applied: %d keys, %s", inv.Count(0), state())
	}
	// A two-chunk snapshot replaces the keys and puts the endpoint in sync.
	inv.Add(0, []uint64{99})
	e.apply(msg(header{op: OpSnapshot, epoch: 5, seq: 10, chunk: 0, chunks: 2}, 1, 2))
	if state() == StateOK {
		t.Fatal("in sync after the first of two chunks")
	}
	e.apply(msg(header{op: OpSnapshot, epoch: 5, seq: 10, chunk: 1, chunks: 2}, 3))
	if state() != StateOK || inv.Count(0) != 3 || e.lastSeq.Load() != 10 {
		t.Fatalf("after snapshot: %s, %d keys, seq %d", state(), inv.Count(0), e.lastSeq.Load())
	}
	// In-order ops apply; a duplicate is ignored; a gap applies but degrades.
	e.apply(msg(header{op: OpStore, epoch: 5, seq: 11}, 4))
	e.apply(msg(header{op: OpRemove, epoch: 5, seq: 12}, 1))
	e.apply(msg(header{op: OpStore, epoch: 5, seq: 12}, 77))
	if state() != StateOK || inv.Count(0) != 3 || e.ignored.Get() != 2 {
		t.Fatalf("in order: %s, %d keys, %d ignored", state(), inv.Count(0), e.ignored.Get())
	}
	e.apply(msg(header{op: OpStore, epoch: 5, seq: 15}, 5))
	if s, why := r.State(0); s != StateDegraded || !strings.Contains(why, "gap") || e.gaps.Get() != 1 || inv.Count(0) != 4 {
		t.Fatalf("gap: %s %q gaps %d keys %d", s, why, e.gaps.Get(), inv.Count(0))
	}
	// The key kind the ingest replica names: KeyGen moves when it changes, only then.
	if g := r.KeyGen(); g != gen {
		t.Fatalf("KeyGen moved from %d to %d without a change of key kind", gen, g)
	}
	e.apply(msg(header{op: OpStore, epoch: 5, seq: 16, kind: kindFast}, 6))
	e.apply(msg(header{op: OpStore, epoch: 5, seq: 17, kind: kindFast}, 7))
	if g := r.KeyGen(); g != gen+1 || !r.UsesFastKeys(0) {
		t.Fatalf("to fast keys: KeyGen %d (was %d), fast %v", g, gen, r.UsesFastKeys(0))
	}
	e.apply(msg(header{op: OpStore, epoch: 5, seq: 18}, 8))
	if g := r.KeyGen(); g != gen+2 || r.UsesFastKeys(0) {
		t.Fatalf("back to engine keys: KeyGen %d (was %d), fast %v", g, gen, r.UsesFastKeys(0))
	}
	// The next snapshot heals it; a clear empties the endpoint.
	e.apply(msg(header{op: OpSnapshot, epoch: 5, seq: 20, chunks: 1}, 2, 3, 4, 5))
	e.apply(msg(header{op: OpClear, epoch: 5, seq: 21}))
	if state() != StateOK || inv.Count(0) != 0 {
		t.Fatalf("clear: %s %d", state(), inv.Count(0))
	}
	// A new epoch (the ingest replica restarted): its ops wait for its snapshot, the old
	// keys stay meanwhile.
	e.apply(msg(header{op: OpStore, epoch: 5, seq: 22}, 8))
	e.apply(msg(header{op: OpStore, epoch: 6, seq: 1}, 9))
	if s, why := r.State(0); s != StateSyncing || !strings.Contains(why, "epoch") || inv.Count(0) != 1 {
		t.Fatalf("new epoch: %s %q %d", s, why, inv.Count(0))
	}
	// A continuation without its head is ignored and degrades.
	e.apply(msg(header{op: OpSnapshot, epoch: 6, seq: 3, chunk: 1, chunks: 2}, 1))
	if s, _ := r.State(0); s != StateDegraded || inv.Count(0) != 1 {
		t.Fatalf("headless chunk: %s %d", s, inv.Count(0))
	}
	e.apply(msg(header{op: OpSnapshot, epoch: 6, seq: 3, chunks: 1, kind: kindFast}, 10, 11))
	if state() != StateOK || inv.Count(0) != 2 || !r.UsesFastKeys(0) {
		t.Fatalf("new epoch's snapshot: %s %d fast=%v", state(), inv.Count(0), r.UsesFastKeys(0))
	}
	// The periodic snapshot of an endpoint in sync changes nothing; one that disagrees
	// (same position, other keys) is reconciled without emptying the endpoint.
	rec := e.reconciled.Get()
	e.apply(msg(header{op: OpSnapshot, epoch: 6, seq: 3, chunks: 1, kind: kindFast}, 10, 11))
	if e.reconciled.Get() != rec || inv.Count(0) != 2 || state() != StateOK {
		t.Fatalf("in-sync snapshot reconciled (%d -> %d)", rec, e.reconciled.Get())
	}
	e.apply(msg(header{op: OpSnapshot, epoch: 6, seq: 3, chunks: 1, kind: kindFast}, 11, 12, 13))
	if got := invKeys(inv.(*shard.Inventory), 0); e.reconciled.Get() != rec+1 || !slices.Equal(got, []uint64{11, 12, 13}) {
		t.Fatalf("reconciled to %v", got)
	}
	// Garbage is counted, never applied.
	e.apply([]byte("not a plane message at all, just bytes"))
	if e.decodeErrors.Get() != 1 || inv.Count(0) != 3 {
		t.Fatal("garbage applied")
	}
}

// Applying a consumed store of keys the endpoint holds allocates nothing.
func TestRouteApplyAllocs(t *testing.T) {
	r, e := offlineRoute(t)
	keys := make([]uint64, 256)
	for i := range keys {
		keys[i] = uint64(i)*0x9E3779B97F4A7C15 + 1
	}
	e.apply(appendMsg(nil, header{op: OpSnapshot, epoch: 1, seq: 0, chunks: 1}, keys))
	msgs := make([][]byte, 64)
	for i := range msgs {
		msgs[i] = appendMsg(nil, header{op: OpStore, epoch: 1, seq: uint64(i + 1)}, keys[i:i+64])
	}
	i := 0
	allocs := testing.AllocsPerRun(len(msgs)-1, func() {
		e.apply(msgs[i])
		i++
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocs per applied message", allocs)
	}
	if s, _ := r.State(0); s != StateOK {
		t.Fatalf("state %s", s)
	}
}
