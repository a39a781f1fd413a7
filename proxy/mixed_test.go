package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// A converged pool mixing vLLM (engine keys) and TensorRT-LLM (drained events
// re-hashed into kvgate's fast keys): each set of endpoints is scored with its own keys
// and the best overlap wins across both.
func TestKVMixedEngineAndFastKeys(t *testing.T) {
	c := vllmChain(t)
	v := newKVEngine(t, "v", enginepub.VLLM)
	q := &enginepub.TRTQueue{}
	trt := trtEngine(t, "trt", func(w http.ResponseWriter, r *http.Request, body []byte) bool { return false })
	trt.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		if r.URL.Path == "/kv_cache_events" {
			w.Header().Set("Content-Type", "application/json")
			w.Write(q.Drain(nil))
			return true
		}
		return false
	}
	cfg := kvConfig(t, KVConverged, v.spec(0, "vllm", ""), fmt.Sprintf("name=trt,url=%s,engine=trtllm", trt.url()))
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	v.store(t, c, toks, 2)
	// TensorRT-LLM holds 6 blocks under its own hashes; kvgate re-hashes their tokens.
	var blocks []enginepub.TRTBlock
	for i := 0; i < 6; i++ {
		blocks = append(blocks, enginepub.TRTBlock{Hash: uint64(1000 + i), Tokens: toks[i*blockSize : (i+1)*blockSize]})
	}
	q.Stored(0, false, blocks...)
	waitFor(t, "events", func() bool { return s.kv.inv.Count(0) == 2 && s.kv.inv.Count(1) == 6 })
	if !s.kv.mgr.UsesFastKeys(1) || s.kv.mgr.UsesFastKeys(0) {
		t.Fatalf("key modes: vllm fast=%v trt fast=%v", s.kv.mgr.UsesFastKeys(0), s.kv.mgr.UsesFastKeys(1))
	}
	res, body := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-endpoint") != "trt" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("%d %s %s %s", res.StatusCode, res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"), body)
	}
	post(t, s.admURL("/admin/endpoints/trt/down"), "")
	res, _ = post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.Header.Get("x-kvgate-endpoint") != "v" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Errorf("trt down: %s %s", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"))
	}
}

// A KV miss uses the rule's selector (chwbl here) and keeps the miss reason visible.
func TestKVMissUsesCHWBL(t *testing.T) {
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""))
	cfg.Select.Kind = SelectCHWBL
	cfg.KV.PendingTTL = 0 // a repeat would follow its own pending entries (TestKVPendingEntries)
	s := startProxy(t, cfg)
	body := `{"model":"qwen3","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}]}`
	var first string
	for i := 0; i < 4; i++ {
		res, _ := post(t, s.url("/v1/chat/completions"), body)
		if res.Header.Get("x-kvgate-route") != "kv-miss:no_worker" {
			t.Errorf("route %q", res.Header.Get("x-kvgate-route"))
		}
		if first == "" {
			first = res.Header.Get("x-kvgate-endpoint")
		} else if first != res.Header.Get("x-kvgate-endpoint") {
			t.Errorf("chwbl fallback not sticky: %s vs %s", first, res.Header.Get("x-kvgate-endpoint"))
		}
	}
}

// An engine dying mid-stream must not look like a clean end to the client.
func TestMidStreamFailureAborts(t *testing.T) {
	ln := listenLocal(t)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 4096)
		conn.Read(buf)
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		io.WriteString(conn, "10\r\ndata: {\"a\":1}\n\n\r\n")
		time.Sleep(50 * time.Millisecond)
		conn.Close() // no terminating chunk
	}()
	defer ln.Close()
	s := startProxy(t, testConfig("http://"+ln.Addr().String()))
	conn, err := net.Dial("tcp", s.PublicAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m","prompt":"x","stream":true}`
	io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n"+body)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(conn)
	if !strings.Contains(string(got), `data: {"a":1}`) {
		t.Fatalf("relayed %q", got)
	}
	if strings.HasSuffix(string(got), "0\r\n\r\n") {
		t.Errorf("broken upstream stream ended cleanly for the client: %q", got)
	}
	waitFor(t, "mid-stream error counted", func() bool { return s.m.upstream[ErrMidStream][0].Get() == 1 })
}

// A non-streamed body cut short by the engine becomes a 502, not a truncated 200.
func TestTruncatedBody502(t *testing.T) {
	s := startProxy(t, testConfig(rawEngine(t, truncatingEngine)))
	res, body := post(t, s.url("/v1/completions"), complBody)
	if res.StatusCode != 502 {
		t.Errorf("status %d %q", res.StatusCode, body)
	}
	checkErrorBody(t, body, 502)
}

// Engines behind Python servers send lower-case header names: hop-by-hop ones are
// still dropped on the way back, end-to-end ones kept.
func TestResponseHopByHopLowerCase(t *testing.T) {
	engine := rawEngine(t, func(conn net.Conn) {
		defer conn.Close()
		buf := make([]byte, 4096)
		conn.Read(buf)
		io.WriteString(conn, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nkeep-alive: timeout=5\r\nconnection: keep-alive, x-private\r\nx-private: 1\r\nx-engine: e\r\n\r\n{}")
	})
	s := startProxy(t, testConfig(engine))
	res, body := post(t, s.url("/v1/completions"), complBody)
	if res.StatusCode != 200 || body != "{}" {
		t.Fatalf("%d %q", res.StatusCode, body)
	}
	if res.Header.Get("Keep-Alive") != "" || res.Header.Get("X-Private") != "" {
		t.Errorf("hop-by-hop response headers forwarded: %v", res.Header)
	}
	if res.Header.Get("X-Engine") != "e" || res.Header.Get("Content-Type") != "application/json" {
		t.Errorf("end-to-end response headers lost: %v", res.Header)
	}
}

// An endpoint whose events fail parity switches to kvgate's fast keys while kvgate runs:
// the request path's classification of the slots (kept between requests, keyedSlots)
// follows, so the next request scores that endpoint by fast keys and finds its blocks.
func TestKeyedSlotsFollowSwitch(t *testing.T) {
	a, b := newKVEngine(t, "a", enginepub.VLLM), newKVEngine(t, "b", enginepub.VLLM)
	cfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""), b.spec(1, "vllm", ""))
	cfg.KV.PendingTTL = 0 // only the engines' events count as held
	s := startProxy(t, cfg)
	toks := engineTokens(t, sharedPrefix)
	post(t, s.url("/v1/completions"), complPrompt(sharedPrefix)) // classified: both by engine keys
	gen := s.kv.keyedSlots().gen
	if s.kv.mgr.UsesFastKeys(0) {
		t.Fatal("a starts on fast keys")
	}
	// Keys that are not the contract's for these tokens: parity fails, a switches.
	bogus := make([]uint64, 4)
	for i := range bogus {
		bogus[i] = 0xbad0000 + uint64(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.pub.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.pub.Publish(enginepub.BlockStored{Hashes: bogus, TokenIDs: toks[:4*blockSize], BlockSize: blockSize}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a on fast keys", func() bool { return s.kv.mgr.UsesFastKeys(0) && s.kv.inv.Count(0) == 4 })
	res, body := post(t, s.url("/v1/completions"), complPrompt(sharedPrefix))
	if res.Header.Get("x-kvgate-endpoint") != "a" || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("after the switch: %s %s %s", res.Header.Get("x-kvgate-endpoint"), res.Header.Get("x-kvgate-route"), body)
	}
	if kc := s.kv.keyedSlots(); kc.gen == gen || !kc.fast.Has(0) || kc.eng.Has(0) || !kc.eng.Has(1) {
		t.Fatalf("classification gen %d (was %d): fast %v eng %v", kc.gen, gen, kc.fast, kc.eng)
	}
}
