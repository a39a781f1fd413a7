package proxy

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
)

// TestFaultEngineKilledAndRestarted: the engine holding a prompt's blocks dies (HTTP
// server and event publisher gone) under load, then comes back on the same addresses
// with its seq back to 0 and an empty cache. No request is lost while it is away (the
// other endpoint serves); kvgate clears its inventory on the restart (seq went
// backwards), follows its new events, and KV hits return to it.
func TestFaultEngineKilledAndRestarted(t *testing.T) {
	c := vllmChain(t)
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	// b's HTTP side on a listener we can kill and re-open on the same port.
	bln := listenLocal(t)
	baddr := bln.Addr().String()
	bsrv := &http.Server{Handler: http.HandlerFunc(b.serve)}
	go bsrv.Serve(bln)
	spec := "name=b,url=http://" + baddr + ",engine=vllm,events=" + b.pub.Addr()
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), spec)
	cfg.Breaker.Failures = 2
	cfg.Breaker.OpenFor = 100 * time.Millisecond
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	b.store(t, c, toks, 8)
	waitFor(t, "b's blocks", func() bool { return s.kv.inv.Count(1) == 8 })
	if res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)); res.Header.Get("x-kvgate-endpoint") != "b" {
		t.Fatalf("before the kill: %s", res.Header.Get("x-kvgate-endpoint"))
	}

	// Load runs through the kill and the restart.
	var lost, served atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := httpc.Post(s.url("/v1/completions"), "application/json", strings.NewReader(complPrompt(sharedPrefix)))
				if err != nil {
					lost.Add(1)
					continue
				}
				res.Body.Close()
				if res.StatusCode != 200 {
					lost.Add(1)
				} else {
					served.Add(1)
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	// Kill b.
	bsrv.Close()
	b.pub.Close()
	waitFor(t, "b's events disconnected", func() bool { return !s.kv.mgr.Status(1).Connected })
	time.Sleep(200 * time.Millisecond) // traffic while b is dead
	// Restart b on the same ports: seq 0, nothing cached yet.
	ln2, err := net.Listen("tcp", baddr)
	if err != nil {
		t.Fatalf("re-listen: %v", err)
	}
	bsrv2 := &http.Server{Handler: http.HandlerFunc(b.serve)}
	go bsrv2.Serve(ln2)
	defer bsrv2.Close()
	var pub2 *enginepub.Publisher
	for try := 0; ; try++ {
		if pub2, err = enginepub.New(enginepub.Config{Endpoint: b.pub.Addr(), Format: enginepub.Format{Flavor: enginepub.VLLM}}); err == nil {
			break
		}
		if try > 50 {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer pub2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := pub2.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	// The restarted engine caches the prefix again (5 blocks this time).
	keys := hashesFor(t, c, toks, 5)
	pub2.Publish(enginepub.BlockStored{Hashes: keys, TokenIDs: toks[:5*blockSize], BlockSize: blockSize})
	waitFor(t, "restart seen, inventory rebuilt", func() bool {
		st := s.kv.mgr.Status(1)
		return st.Restarts == 1 && s.kv.inv.Count(1) == 5
	})
	waitFor(t, "KV hits back on b", func() bool {
		res, _ := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
		return res.Header.Get("x-kvgate-endpoint") == "b" && res.Header.Get("x-kvgate-route") == "kv-hit"
	})
	close(stop)
	wg.Wait()
	if lost.Load() != 0 {
		t.Errorf("lost %d of %d requests while a healthy endpoint existed", lost.Load(), lost.Load()+served.Load())
	}
	t.Logf("engine kill/restart: %d served, %d lost", served.Load(), lost.Load())
}

func hashesFor(t *testing.T, c hashcore.Chain, toks []uint32, n int) []uint64 {
	return hashcore.Keys(c, nil, toks[:n*blockSize], nil)
}
