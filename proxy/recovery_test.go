package proxy

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// An engine dies and comes back on the same ports after its subscriber's redial backoff
// has grown to seconds. Its health check passing again resubscribes its events at once
// (not at the next backoff step), and its restarted sequence (seq 0 again) clears the
// keys it held before the new ones are applied.
func TestRecoveryResubscribesWhenHealthReturns(t *testing.T) {
	c := vllmChain(t)
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	bln := listenLocal(t)
	baddr := bln.Addr().String()
	bsrv := &http.Server{Handler: http.HandlerFunc(b.serve)}
	go bsrv.Serve(bln)
	spec := "name=b,url=http://" + baddr + ",engine=vllm,events=" + b.pub.Addr()
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), spec)
	cfg.Health.Interval, cfg.Health.Timeout = 100*time.Millisecond, 500*time.Millisecond
	s, lb := startLogged(t, cfg, nil)
	toks := engineTokens(t, sharedPrefix)
	b.store(t, c, toks, 8)
	waitFor(t, "b's blocks", func() bool { return s.kv.inv.Count(1) == 8 })

	bsrv.Close()
	b.pub.Close()
	waitFor(t, "b down", func() bool { return !s.roster().eps[1].healthy.Load() && !s.kv.mgr.Status(1).Connected })
	// Redials at +0 s, +1 s, +3 s fail; the next is due at +7 s.
	time.Sleep(3500 * time.Millisecond)

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
	back := time.Now()
	waitFor(t, "b resubscribed", func() bool { return s.kv.mgr.Status(1).Connected })
	if d := time.Since(back); d > 2*time.Second {
		t.Errorf("resubscribed %v after the engine came back: waited out the backoff", d)
	}
	if len(lb.lines("redialing now", "endpoint=b")) == 0 {
		t.Errorf("the health check did not cut the backoff short:\n%s", lb.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pub2.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	pub2.Publish(enginepub.BlockStored{Hashes: hashesFor(t, c, toks, 3), TokenIDs: toks[:3*blockSize], BlockSize: blockSize})
	waitFor(t, "restart cleared the old keys", func() bool {
		st := s.kv.mgr.Status(1)
		return st.Restarts == 1 && s.kv.inv.Count(1) == 3
	})
}
