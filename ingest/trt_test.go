package ingest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
)

type trtGolden struct {
	Name   string `json:"name"`
	Body   string `json:"body"`
	Error  bool   `json:"error"`
	Events []struct {
		ID        int64   `json:"id"`
		Type      string  `json:"type"`
		Parent    *string `json:"parent"`
		Blocks    [][]any `json:"blocks"`
		Hashes    []string
		BlockHash string `json:"block_hash"`
		NewLevel  *int   `json:"new_level"`
	} `json:"events"`
}

// TestTRTParseGoldens parses drain bodies written by Python's json.
func TestTRTParseGoldens(t *testing.T) {
	var gs []trtGolden
	loadJSON(t, "trt.json", &gs)
	for _, g := range gs {
		t.Run(g.Name, func(t *testing.T) {
			evs, err := parseTRTEvents([]byte(g.Body))
			if g.Error {
				if err == nil {
					t.Fatalf("bad body parsed: %+v", evs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != len(g.Events) {
				t.Fatalf("%d events, want %d", len(evs), len(g.Events))
			}
			for i, w := range g.Events {
				e := evs[i]
				if *e.EventID != w.ID || e.Data.Type != w.Type {
					t.Fatalf("event %d: id %d type %s, want %d %s", i, *e.EventID, e.Data.Type, w.ID, w.Type)
				}
				switch w.Type {
				case "stored":
					if (w.Parent == nil) != (e.Data.ParentHash == nil) || (w.Parent != nil && *w.Parent != strconv.FormatUint(uint64(*e.Data.ParentHash), 10)) {
						t.Fatalf("event %d parent", i)
					}
					if len(e.Data.Blocks) != len(w.Blocks) {
						t.Fatalf("event %d blocks", i)
					}
					for j, wb := range w.Blocks {
						b := e.Data.Blocks[j]
						var toks []uint32
						for _, tk := range b.Tokens {
							toks = append(toks, tk.TokenID)
						}
						var wt []uint32
						for _, x := range wb[1].([]any) {
							wt = append(wt, uint32(x.(float64)))
						}
						if strconv.FormatUint(uint64(b.BlockHash), 10) != wb[0].(string) || !slices.Equal(toks, wt) || *b.CacheLevel != int(wb[2].(float64)) {
							t.Fatalf("event %d block %d: %+v", i, j, b)
						}
					}
				case "removed":
					var got []string
					for _, h := range e.Data.BlockHashes {
						got = append(got, strconv.FormatUint(uint64(h), 10))
					}
					if !slices.Equal(got, w.Hashes) {
						t.Fatalf("removed %v want %v", got, w.Hashes)
					}
				case "updated":
					if strconv.FormatUint(uint64(*e.Data.BlockHash), 10) != w.BlockHash {
						t.Fatalf("updated hash")
					}
					if (w.NewLevel == nil) != (e.Data.CacheLevel == nil) || (w.NewLevel != nil && *e.Data.CacheLevel.New != *w.NewLevel) {
						t.Fatalf("updated level")
					}
				}
			}
		})
	}
}

func toks(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

// fastKey is kvgate's fast key of the last block of prefix, as the request path computes it.
func fastKey(bs int, prefix ...[]uint32) uint64 {
	k := hashcore.Keys(hashcore.NewFast(bs), nil, slices.Concat(prefix...), nil)
	return k[len(k)-1]
}

// TestTRTDrainOverHTTP drains a real net/http server on 127.0.0.1 that serves a TensorRT-
// LLM event queue, through stored/removed/updated/created events, gaps and a restart.
func TestTRTDrainOverHTTP(t *testing.T) {
	const bs = 8
	var q enginepub.TRTQueue
	var fail atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/kv_cache_events" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		if fail.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(q.Drain(nil))
	}))
	defer srv.Close()
	inv := newInv(t)
	cfg := testConfig(inv)
	cfg.Fast = hashcore.NewFast(bs)
	m := startManager(t, cfg, EndpointConfig{Name: "trt", Index: 2, Engine: "trtllm", URL: srv.URL})
	st := func() EndpointStatus { return m.Status(2) }
	waitUntilID := func(id int64) {
		t.Helper()
		waitFor(t, "event_id "+strconv.FormatInt(id, 10), func() bool { return q.Len() == 0 && st().LastSeq == id })
	}
	A0, A1, B0, C0 := toks(0, bs), toks(100, bs), toks(200, bs), toks(300, bs)
	const hA0, hA1, hB0, hC0 = 1 << 63, 11, 12, 13
	q.Created(100, 10)
	q.Stored(0, false, enginepub.TRTBlock{Hash: hA0, Tokens: A0}, enginepub.TRTBlock{Hash: hA1, Tokens: A1})
	q.Stored(hA1, true, enginepub.TRTBlock{Hash: hB0, Tokens: B0})
	q.Stored(hA0, true, enginepub.TRTBlock{Hash: hC0, Tokens: C0, CacheLevel: 1}) // host memory: tracked, not routed
	waitUntilID(3)
	want := sorted([]uint64{fastKey(bs, A0), fastKey(bs, A0, A1), fastKey(bs, A0, A1, B0)})
	if got := invKeys(inv, 2); !slices.Equal(got, want) {
		t.Fatalf("after stored: got %v want %v", got, want)
	}
	if s := st(); !s.Rehash || !m.UsesFastKeys(2) || s.Tiers["CPU"] != 1 || !s.Connected {
		t.Fatalf("%+v", s)
	}
	q.Removed(hA1)
	q.Updated(hC0, 1, 0) // onboarded to GPU: now routed
	q.Updated(hA0, 0, 1) // offloaded: no longer routed
	waitUntilID(6)
	want = sorted([]uint64{fastKey(bs, A0, A1, B0), fastKey(bs, A0, C0)})
	if got := invKeys(inv, 2); !slices.Equal(got, want) {
		t.Fatalf("after removed/updated: got %v want %v", got, want)
	}
	q.SkipIDs(10)
	D0 := toks(400, bs)
	q.Stored(0, false, enginepub.TRTBlock{Hash: 20, Tokens: D0})
	waitUntilID(17)
	if s := st(); s.GapsKept != 1 || s.Keys != 3 {
		t.Fatalf("gap 10: %+v", s)
	}
	q.SkipIDs(100)
	q.Stored(0, false, enginepub.TRTBlock{Hash: 21, Tokens: toks(500, bs)}, enginepub.TRTBlock{Hash: 22, Tokens: toks(600, 3)})
	waitUntilID(118)
	if s := st(); s.GapsCleared != 1 || s.Unkeyable != 1 || !slices.Equal(invKeys(inv, 2), []uint64{fastKey(bs, toks(500, bs))}) {
		t.Fatalf("gap 100: %+v %v", s, invKeys(inv, 2))
	}
	// Server outage, then a restarted server (event_id back to 0).
	fail.Store(true)
	waitFor(t, "disconnect", func() bool { return !st().Connected })
	q.ResetIDs()
	q.Stored(0, false, enginepub.TRTBlock{Hash: 30, Tokens: D0})
	fail.Store(false)
	waitUntilID(0)
	if s := st(); s.Restarts != 1 || s.Reconnects != 1 {
		t.Fatalf("after restart: %+v", s)
	}
	if got := invKeys(inv, 2); !slices.Equal(got, []uint64{fastKey(bs, D0)}) {
		t.Fatalf("after restart: %v", got)
	}
	q.Stored(99, true, enginepub.TRTBlock{Hash: 31, Tokens: A0}) // unknown parent
	q.Created(5)
	waitUntilID(2)
	if s := st(); s.Orphans != 1 || s.Keys != 0 {
		t.Fatalf("%+v", s)
	}
}

// FuzzTRTEvents: any drain body parses or fails cleanly, and applying what parses never
// panics.
func FuzzTRTEvents(f *testing.F) {
	var gs []trtGolden
	loadJSON(f, "trt.json", &gs)
	for _, g := range gs {
		f.Add([]byte(g.Body))
	}
	inv := newInv(f)
	cfg := testConfig(inv)
	cfg.Fast = hashcore.NewFast(8)
	cfg.BlockMapSize = 256 // a created event clears the map: keep that cheap per input
	m, err := NewManager(cfg, []EndpointConfig{{Name: "trt", Engine: "trtllm", URL: "http://127.0.0.1:1"}})
	if err != nil {
		f.Fatal(err)
	}
	a := newTRTApplier(m.eps[0])
	f.Fuzz(func(t *testing.T, body []byte) {
		evs, err := parseTRTEvents(body)
		if err != nil {
			return
		}
		a.apply(evs)
		if _, err := json.Marshal(evs); err != nil {
			t.Fatal(err)
		}
	})
}
