package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// The event-plane flags refuse contradictions naming the flag; a route replica needs no
// events= address.
func TestServePlaneFlags(t *testing.T) {
	kv := []string{"-kv-mode", "3", "-tokenizer", "m=/tmp"}
	ep := "url=http://127.0.0.1:1,events=tcp://127.0.0.1:2"
	cases := []struct {
		args []string
		flag string
	}{
		{append([]string{"-endpoint", ep, "-events-plane", "kafka"}, kv...), "-events-plane"},
		{[]string{"-endpoint", ep, "-events-plane", "jetstream", "-nats-url", "nats://127.0.0.1:4222"}, "-events-plane"},
		{append([]string{"-endpoint", ep, "-nats-url", "nats://127.0.0.1:4222"}, kv...), "-events-plane"},
		{append([]string{"-endpoint", ep, "-events-plane", "jetstream"}, kv...), "-nats-url"},
		{append([]string{"-endpoint", ep, "-events-plane", "jetstream", "-nats-url", "http://127.0.0.1:4222"}, kv...), "-nats-url"},
		{append([]string{"-endpoint", ep, "-events-plane", "jetstream", "-nats-url", "nats://127.0.0.1:4222", "-plane-role", "leader"}, kv...), "-plane-role"},
		{append([]string{"-endpoint", ep, "-events-plane", "jetstream", "-nats-url", "nats://127.0.0.1:4222", "-plane-max-age", "40s"}, kv...), "-plane-max-age"},
		{append([]string{"-endpoint", ep, "-events-plane", "jetstream", "-nats-url", "nats://127.0.0.1:4222", "-plane-stream", "a.b"}, kv...), "-plane-stream"},
		// Without the plane, KV-Exact still needs each engine's events.
		{append([]string{"-endpoint", "url=http://127.0.0.1:1"}, kv...), "-endpoint"},
	}
	for _, tc := range cases {
		var stderr bytes.Buffer
		code := runServe(tc.args, nil, io.Discard, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.flag+":") {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", tc.args, code, stderr.String(), tc.flag)
		}
	}
	cfg, _, err := serveFlags(append([]string{"-endpoint", "url=http://127.0.0.1:1", "-events-plane", "jetstream",
		"-nats-url", "nats://127.0.0.1:4222", "-plane-role", "route"}, kv...), io.Discard)
	if err != nil {
		t.Fatalf("route replica without events=: %v", err)
	}
	if cfg.Plane.Kind != "jetstream" || cfg.Plane.Role != "route" || cfg.Plane.SnapshotInterval.Seconds() != 30 || cfg.Plane.MaxAge.Minutes() != 10 {
		t.Fatalf("%+v", cfg.Plane)
	}
	var stderr bytes.Buffer
	runServe([]string{"-h"}, nil, io.Discard, &stderr)
	for _, want := range []string{"-events-plane", `(default "direct")`, "-plane-role", "-nats-url", "-plane-snapshot-interval", "(default 30s)", "-plane-max-age", "(default 10m0s)", "-plane-max-bytes", "(default 2147483648)"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}
