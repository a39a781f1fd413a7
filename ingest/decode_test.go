package ingest

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kvgate/kvgate/engine"
)

type goldenEvent struct {
	Kind         string   `json:"kind"`
	Hashes       []string `json:"hashes"`
	HasParent    bool     `json:"has_parent"`
	Parent       string   `json:"parent"`
	Tokens       []uint32 `json:"tokens"`
	BlockSize    int      `json:"block_size"`
	Medium       string   `json:"medium"`
	LoRAName     string   `json:"lora_name"`
	HasExtraKeys bool     `json:"has_extra_keys"`
	Bad          string   `json:"bad,omitempty"`
	HasSalt      bool     `json:"has_salt,omitempty"`
	CacheSalt    string   `json:"cache_salt,omitempty"`
	Bigram       bool     `json:"bigram,omitempty"`
	Group        *int     `json:"group,omitempty"`
	SpecKind     string   `json:"spec_kind,omitempty"`
	Window       int      `json:"sliding_window,omitempty"`
	Component    string   `json:"component,omitempty"`
}

type goldenBatch struct {
	Name    string        `json:"name"`
	Flavor  string        `json:"flavor"`
	Payload string        `json:"payload"`
	Error   bool          `json:"error"`
	TS      float64       `json:"ts"`
	DPRank  int           `json:"dp_rank"`
	Events  []goldenEvent `json:"events"`
}

func loadJSON(t testing.TB, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "ingest", name))
	if err != nil {
		t.Fatalf("%v (regenerate with /usr/bin/python3 tools/gen-ingest-goldens.py)", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}

func loadBatches(t testing.TB) []goldenBatch {
	var gs []goldenBatch
	loadJSON(t, "batches.json", &gs)
	if len(gs) < 30 {
		t.Fatalf("only %d golden batches", len(gs))
	}
	return gs
}

func flavorOf(s string) engine.Kind {
	if s == "sglang" {
		return engine.SGLang
	}
	return engine.VLLM
}

func u64s(t testing.TB, ss []string) []uint64 {
	out := make([]uint64, len(ss))
	for i, s := range ss {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = v
	}
	return out
}

func kindName(k EventKind) string {
	return [...]string{"unknown", "stored", "removed", "cleared", "invalid"}[k]
}

// TestDecodeGoldens decodes batches written by Python's msgpack and compares every field
// with the values the batch was built from.
func TestDecodeGoldens(t *testing.T) {
	for _, g := range loadBatches(t) {
		t.Run(g.Name, func(t *testing.T) {
			p, err := hex.DecodeString(g.Payload)
			if err != nil {
				t.Fatal(err)
			}
			d := BatchDecoder{Engine: flavorOf(g.Flavor)}
			var ev Event
			var got []goldenEvent
			if err := d.Reset(p); err == nil {
				for d.Next(&ev) {
					ge := goldenEvent{Kind: kindName(ev.Kind)}
					if ev.Group >= 0 {
						g := ev.Group
						ge.Group = &g
					}
					switch ev.Kind {
					case EventInvalid:
						ge.Bad = ev.Bad.String()
					case EventStored:
						ge.HasParent, ge.Parent = ev.HasParent, strconv.FormatUint(ev.Parent, 10)
						ge.Tokens = append([]uint32{}, ev.Tokens...)
						ge.BlockSize, ge.LoRAName = ev.BlockSize, string(ev.LoRAName)
						ge.HasExtraKeys = ev.ExtraKeys != nil
						ge.HasSalt, ge.CacheSalt, ge.Bigram = ev.HasSalt, string(ev.CacheSalt), ev.Bigram
						ge.SpecKind, ge.Window = string(ev.SpecKind), ev.SlidingWindow
						fallthrough
					case EventRemoved:
						ge.Medium = ev.Medium.String()
						ge.Component = string(ev.Component)
						ge.Hashes = []string{}
						for _, h := range ev.Hashes {
							ge.Hashes = append(ge.Hashes, strconv.FormatUint(h, 10))
						}
					}
					got = append(got, ge)
				}
			}
			rank, err := d.Finish()
			if g.Error {
				if err == nil {
					t.Fatalf("malformed payload decoded without error: %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if d.Timestamp() != g.TS || rank != g.DPRank {
				t.Fatalf("ts %v rank %d, want %v %d", d.Timestamp(), rank, g.TS, g.DPRank)
			}
			for i := range g.Events {
				if g.Events[i].Tokens == nil && g.Events[i].Kind == "stored" {
					g.Events[i].Tokens = []uint32{}
				}
			}
			for i := range got {
				if got[i].Kind == "stored" && got[i].Tokens == nil {
					got[i].Tokens = []uint32{}
				}
			}
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(g.Events)
			if len(g.Events) == 0 && len(got) == 0 {
				return
			}
			if string(gj) != string(wj) {
				t.Fatalf("decoded\n%s\nwant\n%s", gj, wj)
			}
		})
	}
}

// FuzzDecodeBatch: any payload decodes or fails cleanly, never panics, and every slice
// the decoder hands out stays inside what it was given.
func FuzzDecodeBatch(f *testing.F) {
	for _, g := range loadBatches(f) {
		p, _ := hex.DecodeString(g.Payload)
		f.Add(p, g.Flavor == "sglang")
	}
	f.Fuzz(func(t *testing.T, p []byte, sglang bool) {
		d := BatchDecoder{}
		if sglang {
			d.Engine = engine.SGLang
		}
		var ev Event
		n := 0
		if d.Reset(p) == nil {
			for d.Next(&ev) {
				n++
				if len(ev.Hashes) > len(p) || len(ev.Tokens) > len(p) || len(ev.LoRAName) > len(p) {
					t.Fatalf("event larger than payload")
				}
			}
		}
		d.Finish()
		if n > len(p) {
			t.Fatalf("%d events from %d bytes", n, len(p))
		}
	})
}
