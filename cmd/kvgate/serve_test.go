package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

func TestServeRefusalsNameTheFlag(t *testing.T) {
	cases := []struct {
		args []string
		flag string
	}{
		{[]string{}, "-endpoint"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1", "-select", "random"}, "-select"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1", "-kv-mode", "2"}, "-kv-mode"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1,role=prefill,events=tcp://127.0.0.1:2", "-kv-mode", "1", "-tokenizer", "m=/tmp"}, "-kv-mode"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1,engine=llamacpp", "-kv-mode", "3", "-tokenizer", "m=/tmp"}, "-kv-mode"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1,events=tcp://127.0.0.1:2", "-kv-mode", "3"}, "-tokenizer"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1", "-tokenizer", "/tmp"}, "-tokenizer"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1", "-model", "m"}, "-model"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1", "-kv-score", "max"}, "-kv-score"},
		{[]string{"-endpoint", "nourl"}, "-endpoint"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1", "-lora", "x"}, "-lora"},
		{[]string{"-endpoint", "url=http://127.0.0.1:1", "-kv-max-keys-per-endpoint", "0"}, "-kv-max-keys-per-endpoint"},
	}
	for _, tc := range cases {
		var stderr bytes.Buffer
		code := runServe(tc.args, nil, io.Discard, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.flag+":") {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", tc.args, code, stderr.String(), tc.flag)
		}
	}
	var stderr bytes.Buffer
	if code := runServe([]string{"-endpoint", "url=http://127.0.0.1:1,engine=llamacpp", "-kv-mode", "3", "-tokenizer", "m=/tmp"}, nil, io.Discard, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "no event contract") || !strings.Contains(stderr.String(), "-select chwbl") {
		t.Errorf("llama.cpp refusal: %q", stderr.String())
	}
}

func TestServeHelpDocumentsDefaults(t *testing.T) {
	var stderr bytes.Buffer
	if code := runServe([]string{"-h"}, nil, io.Discard, &stderr); code != 0 {
		t.Errorf("-h exit %d", code)
	}
	for _, want := range []string{"-admin-listen", `(default "127.0.0.1:9090")`, "-kv-load-factor", "(default 1)", "-kv-block-size", "(default 16)", "-breaker-open", "(default 10s)", "-max-body-bytes", "-kv-max-keys-per-endpoint", "(default 4194304)"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

// kvgate serve proxies, then drains and exits 0 on SIGTERM.
func TestServeRunsAndStopsOnSIGTERM(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"ok":true}`)
	}))
	defer engine.Close()
	pub, adm := freeAddr(t), freeAddr(t)
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- runServe([]string{"-listen", pub, "-admin-listen", adm, "-endpoint", "name=e,url=" + engine.URL, "-health-interval", "0", "-shutdown-grace", "2s", "-shutdown-delay", "0"}, nil, io.Discard, &lockedWriter{w: &stderr})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := http.Get("http://" + adm + "/healthz")
		if err == nil {
			res.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin listener never came up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := http.Post("http://"+pub+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(b) != `{"ok":true}` || res.Header.Get("x-kvgate-endpoint") != "e" {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("kvgate serve did not stop on SIGTERM")
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
