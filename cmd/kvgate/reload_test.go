package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// countingEngine answers every request with a small JSON body and counts them.
func countingEngine(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/health" {
			n.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// SIGHUP re-reads -config in a real kvgate process: endpoints, the access log and the
// log level change live; a flag that cannot (here -kv-block-size, -listen) is named in a
// WARN and keeps its value; a config that does not parse changes nothing.
func TestServeSIGHUPReloadsConfig(t *testing.T) {
	a, na := countingEngine(t)
	b, nb := countingEngine(t)
	pub, adm := freeAddr(t), freeAddr(t)
	conf := filepath.Join(t.TempDir(), "kvgate.conf")
	write := func(s string) {
		if err := os.WriteFile(conf, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := "listen = " + pub + "\nadmin-listen = " + adm + "\nhealth-interval = 0\nshutdown-delay = 0s\n"
	write(base + "endpoint = name=a,url=" + a.URL + "\n")
	c := startChild(t, "serve", "-config", conf)
	waitStatus(t, "http://"+adm+"/readyz", 200, 20*time.Second)
	send := func(n int) {
		for range n {
			res, err := http.Post("http://"+pub+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
		}
	}
	send(2)
	hup := func(want string) {
		t.Helper()
		before := strings.Count(c.log(), want)
		if err := c.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(c.log(), want) == before {
			if time.Now().After(deadline) {
				t.Fatalf("no %q after SIGHUP:\n%s", want, c.log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	write(base + "endpoint = name=a,url=" + a.URL + "\nendpoint = name=b,url=" + b.URL +
		"\naccess-log = true\nlog-level = debug\nkv-block-size = 32\n")
	hup("SIGHUP: rule reloaded")
	log := c.log()
	for _, want := range []string{"flags=-kv-block-size", "added=b", "access-log=true", "log-level=debug"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	na0 := na.Load()
	send(4)
	if nb.Load() == 0 || na.Load() == na0 {
		t.Errorf("after the reload: a %d, b %d requests (want both)", na.Load()-na0, nb.Load())
	}
	for deadline := time.Now().Add(5 * time.Second); strings.Count(c.log(), "msg=request ") < 4; {
		if time.Now().After(deadline) {
			t.Fatalf("access log off after the reload:\n%s", c.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A config that does not parse: nothing changes, b still serves.
	write(base + "endpoint = name=a,url=" + a.URL + "\nendpoint = name=b,url=ftp://b\n")
	hup("SIGHUP: the rule does not parse or validate")
	nb0 := nb.Load()
	send(4)
	if nb.Load() == nb0 {
		t.Error("a refused reload removed b")
	}
	// b leaves.
	write(base + "endpoint = name=a,url=" + a.URL + "\n")
	hup("SIGHUP: rule reloaded")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(c.log(), "slot freed") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	nb0 = nb.Load()
	send(4)
	if nb.Load() != nb0 {
		t.Errorf("b got %d requests after it left", nb.Load()-nb0)
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("no exit\n%s", c.log())
	}
}

// -endpoints-file is watched in a real kvgate process: a rewrite swaps the file's
// endpoints while the -endpoint flag's stays.
func TestServeEndpointsFileWatched(t *testing.T) {
	a, _ := countingEngine(t)
	b, nb := countingEngine(t)
	c, nc := countingEngine(t)
	pub, adm := freeAddr(t), freeAddr(t)
	file := filepath.Join(t.TempDir(), "endpoints")
	if err := os.WriteFile(file, []byte("name=b,url="+b.URL+" # the file's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ch := startChild(t, "serve", "-listen", pub, "-admin-listen", adm, "-health-interval", "0", "-shutdown-delay", "0s",
		"-endpoint", "name=a,url="+a.URL, "-endpoints-file", file, "-endpoints-watch", "50ms")
	waitStatus(t, "http://"+adm+"/readyz", 200, 20*time.Second)
	if err := os.WriteFile(file+".new", []byte("name=c,url="+c.URL+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".new", file); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(ch.log(), "slot freed") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload:\n%s", ch.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(ch.log(), "added=c removed=b") {
		t.Errorf("log:\n%s", ch.log())
	}
	nb0 := nb.Load()
	for range 4 {
		res, err := http.Post("http://"+pub+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	if nc.Load() == 0 || nb.Load() != nb0 {
		t.Errorf("after the rewrite: c %d requests, b %d more", nc.Load(), nb.Load()-nb0)
	}
}
