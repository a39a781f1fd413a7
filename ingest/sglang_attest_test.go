package ingest

import (
	"encoding/hex"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/hashcore"
)

type sglangStream struct {
	Name         string   `json:"name"`
	BlockSize    int      `json:"block_size"`
	Bigram       bool     `json:"bigram"` // the rule's contract hashes bigrams
	Salt         string   `json:"salt"`
	Payloads     []string `json:"payloads"`
	Tokens       []uint32 `json:"tokens"` // the live pages' plain tokens
	Live         []string `json:"live"`
	StoredEvents int      `json:"stored_events"`
}

// TestSGLangSaltedAndBigramAttestation applies Python-built SGLang streams (salted
// stores with their metadata map, EAGLE bigram token_ids, coalesced multi-page stores)
// and checks that the rule's contract reproduces every engine key, that the inventory
// holds the engine's keys (or kvgate's fast keys, re-hashed from the plain tokens the
// pairs spell), and that a rule without Bigram is diagnosed and switched to re-hashing.
func TestSGLangSaltedAndBigramAttestation(t *testing.T) {
	var streams []sglangStream
	loadJSON(t, "sglang_streams.json", &streams)
	if len(streams) < 4 {
		t.Fatalf("%d streams", len(streams))
	}
	for _, s := range streams {
		for _, mode := range []KeyMode{KeysEngine, KeysRehash, KeysAuto} {
			t.Run(s.Name+"/"+mode.String(), func(t *testing.T) {
				inv := newInv(t)
				cfg := testConfig(inv)
				spec := hashcore.Spec{Engine: "sglang", BlockSize: s.BlockSize, Bigram: s.Bigram}
				c, err := hashcore.New(spec)
				if err != nil {
					t.Fatal(err)
				}
				cfg.Chain, cfg.Spec, cfg.Keys = c, &spec, mode
				m, err := NewManager(cfg, []EndpointConfig{{Name: "s", Engine: "sglang", Events: "tcp://127.0.0.1:1"}})
				if err != nil {
					t.Fatal(err)
				}
				a := newApplier(m.eps[0], m.eps[0].rk[0])
				for _, p := range s.Payloads {
					b, _ := hex.DecodeString(p)
					if err := a.apply(b); err != nil {
						t.Fatal(err)
					}
				}
				st := m.Status(0)
				ruleMisses := strings.HasSuffix(s.Name, "rule-plain")
				if ruleMisses {
					if st.ParityMismatch == 0 || !strings.Contains(st.Cause, "bigram") {
						t.Fatalf("a bigram engine under a plain rule was not diagnosed: %+v", st)
					}
				} else if st.ParityOK != uint64(s.StoredEvents) || st.ParityMismatch != 0 {
					t.Fatalf("parity: %+v", st)
				}
				var want []uint64
				if mode == KeysEngine || (mode == KeysAuto && !ruleMisses) {
					want = sorted(u64s(t, s.Live))
				} else {
					f := hashcore.NewFast(s.BlockSize)
					var ex *hashcore.Extras
					if s.Salt != "" {
						ex = &hashcore.Extras{CacheSalt: s.Salt}
					}
					want = sorted(hashcore.Keys(f, nil, s.Tokens[:len(s.Live)*s.BlockSize], ex))
				}
				if got := invKeys(inv, 0); !slices.Equal(got, want) {
					t.Fatalf("inventory\n got %v\nwant %v\nstatus %+v", got, want, st)
				}
			})
		}
	}
}
