package main

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// An endpoint's pinned block_size is the block size the rule hashes it with (it
// overrides -kv-block-size): the doctor's metrics check must compare the engine's
// block_size with it, not with -kv-block-size.
func TestDoctorBlockSizeHonoursEndpointPin(t *testing.T) {
	_, dir := qwen3(t)
	e := newDocEngine(t, drift{blockSize: 32, algo: "sha256_cbor"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	go func() { e.pub.WaitSubscribed(ctx); cancel() }()
	rule := []string{"-events-wait", "1s", "-kv-mode", "3", "-kv-hash-algo", "sha256_cbor", "-model", "qwen3", "-tokenizer", dir}

	// Engine 32, rule -kv-block-size 32, but the endpoint pinned at 16: keys at 16 miss.
	_, out, _ := runDoctorCLI(t, append(rule, "-kv-block-size", "32", "-endpoint", e.flag("pin16")+",block_size=16")...)
	if got := rows(out, "pin16")["block-size"]; slices.Contains(got, "ok") || !slices.Contains(got, "DRIFT") {
		t.Errorf("endpoint pinned at 16, engine at 32: block-size %v, want DRIFT only\n%s", got, out)
	}
	// Engine 32, endpoint pinned at 32, rule -kv-block-size 16: the endpoint hashes at 32.
	_, out, _ = runDoctorCLI(t, append(rule, "-kv-block-size", "16", "-endpoint", e.flag("pin32")+",block_size=32")...)
	if got := rows(out, "pin32")["block-size"]; slices.Contains(got, "DRIFT") || !slices.Contains(got, "ok") {
		t.Errorf("endpoint pinned at 32, engine at 32: block-size %v, want ok\n%s", got, out)
	}
}

// A -probe-timeout of 0 or less means no timeout at all to net/http: a doctor run against
// an engine that accepts and never answers would hang forever. It, and a negative
// -events-wait, are usage errors naming the flag.
func TestDoctorRefusesNonPositiveDurations(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts, never answers
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	ep := "name=mute,url=http://" + ln.Addr().String()
	for _, c := range []struct{ flag, value string }{
		{"-probe-timeout", "0"}, {"-probe-timeout", "-1s"}, {"-events-wait", "-1s"},
	} {
		type res struct {
			code   int
			stderr string
		}
		done := make(chan res, 1)
		go func() {
			code, _, stderr := runDoctorCLI(t, c.flag, c.value, "-endpoint", ep)
			done <- res{code, stderr}
		}()
		select {
		case r := <-done:
			if r.code != 2 || !strings.Contains(r.stderr, c.flag) {
				t.Errorf("%s %s: exit %d, stderr %q; want 2 naming the flag", c.flag, c.value, r.code, r.stderr)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s %s: doctor still running after 5s (hung on a mute endpoint)", c.flag, c.value)
			ln.Close()
			<-done
			return
		}
	}
}
