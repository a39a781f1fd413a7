package main

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/freeport"
	"github.com/kvgate/kvgate/internal/testfix"
	"github.com/kvgate/kvgate/proxy"
)

func freeAddr(t *testing.T) string {
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
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

// -h lists every registered flag once, under the heading of the proxy.Config part it
// sets, headings in serveFlagGroups' order, each flag with its default, and nothing under
// "Other" (a new flag must be put in a group).
func TestServeHelpGroupsEveryFlag(t *testing.T) {
	var stderr bytes.Buffer
	if code := runServe([]string{"-h"}, nil, io.Discard, &stderr); code != 0 {
		t.Fatalf("-h exit %d", code)
	}
	help := stderr.String()
	checkFlagGroups(t, help, serveFlagGroups, 60, true)
	if !strings.Contains(help, "Listener (") || !strings.Contains(help, "-listen string\n    \tpublic listener address (OpenAI API) (default \":8080\")") {
		t.Errorf("-listen's default is not :8080:\n%s", help)
	}
}

// The flags' defaults are proxy.Defaults(), stated there once: a rule of nothing but an
// endpoint parses to Defaults() with that endpoint, and -listen keeps the :8080 users have.
func TestServeDefaultsAreProxyDefaults(t *testing.T) {
	cfg, level, err := serveFlags([]string{"-endpoint", "url=http://127.0.0.1:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := proxy.Defaults()
	ep, err := proxy.ParseEndpoint("url=http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	want.Fleet.Endpoints = []proxy.EndpointSpec{ep}
	got, exp := reflect.ValueOf(cfg), reflect.ValueOf(want)
	for i := range got.NumField() {
		if g, w := got.Field(i).Interface(), exp.Field(i).Interface(); !reflect.DeepEqual(g, w) {
			t.Errorf("%s: the flags' defaults differ from proxy.Defaults():\n got %+v\nwant %+v", got.Type().Field(i).Name, g, w)
		}
	}
	if cfg.Listener.Addr != ":8080" || level != "info" {
		t.Errorf("listen %q, log level %q", cfg.Listener.Addr, level)
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

// -config: every serve flag is a key; the command line overrides the file (a repeatable
// flag on the command line replaces the file's values); a bad line is refused naming
// the file, the line and the flag. -endpoints-file takes # comments, inline too.
func TestServeConfigFile(t *testing.T) {
	dir := t.TempDir()
	eps := filepath.Join(dir, "endpoints")
	os.WriteFile(eps, []byte("# the pool\nname=c,url=http://10.0.0.3:8000 # third\n\n\tname=d,url=http://10.0.0.4:8000\t# fourth\n"), 0o600)
	conf := filepath.Join(dir, "kvgate.conf")
	os.WriteFile(conf, []byte(`# a rule
listen = 127.0.0.1:18080
select = rr
endpoint = name=a,url=http://10.0.0.1:8000
endpoint = name=b,url=http://10.0.0.2:8000
endpoints-file = `+eps+`
breaker-failures = 7
shutdown-delay = "2s"
access-log = true
`), 0o600)
	cfg, _, err := serveFlags([]string{"-config", conf, "-select", "chwbl"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listener.Addr != "127.0.0.1:18080" || cfg.Select.Kind != proxy.SelectCHWBL || cfg.Breaker.Failures != 7 ||
		cfg.Shutdown.Delay != 2*time.Second || !cfg.Listener.AccessLog || len(cfg.Fleet.Endpoints) != 4 || cfg.Fleet.Endpoints[3].Name != "d" {
		t.Errorf("from the file: %+v", cfg)
	}
	cfg, _, err = serveFlags([]string{"-config", conf, "-endpoint", "name=z,url=http://10.0.0.9:8000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Fleet.Endpoints) != 3 || cfg.Fleet.Endpoints[0].Name != "z" {
		t.Errorf("command-line -endpoint should replace the file's: %v", cfg.Fleet.Endpoints)
	}
	for body, want := range map[string]string{
		"listen = :1\nno-such-flag = 1\n": "kvgate.conf:2: no flag -no-such-flag",
		"breaker-failures = many\n":       "kvgate.conf:1: -breaker-failures",
		"just words\n":                    "kvgate.conf:1: want 'flag = value'",
	} {
		os.WriteFile(conf, []byte(body), 0o600)
		_, _, err := serveFlags([]string{"-config", conf, "-endpoint", "name=a,url=http://10.0.0.1:8000"}, io.Discard)
		var fe *proxy.FlagError
		if !errors.As(err, &fe) || fe.Flag != "-config" || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want -config: ...%s", body, err, want)
		}
	}
}

// -admin-token-file reads the token (trimmed); with -admin-token too, or empty, it is
// refused naming the flag.
func TestServeAdminTokenFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "token")
	os.WriteFile(f, []byte("  s3cret\n"), 0o600)
	ep := "name=a,url=http://10.0.0.1:8000"
	cfg, _, err := serveFlags([]string{"-admin-token-file", f, "-endpoint", ep}, io.Discard)
	if err != nil || cfg.Listener.AdminToken != "s3cret" {
		t.Fatalf("%v %q", err, cfg.Listener.AdminToken)
	}
	if _, _, err := serveFlags([]string{"-admin-token-file", f, "-admin-token", "x", "-endpoint", ep}, io.Discard); err == nil || !strings.Contains(err.Error(), "-admin-token-file") {
		t.Errorf("both: %v", err)
	}
	os.WriteFile(f, []byte("\n"), 0o600)
	if _, _, err := serveFlags([]string{"-admin-token-file", f, "-endpoint", ep}, io.Discard); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty: %v", err)
	}
}

// TestServeHashRefusalsNameTheFlag: a contract hashcore refuses names the serve flag its
// typed error blames (the seed's, the algo's), never one guessed from the message.
func TestServeHashRefusalsNameTheFlag(t *testing.T) {
	rule := []string{"-endpoint", "url=http://127.0.0.1:1,events=tcp://127.0.0.1:2", "-kv-mode", "3",
		"-model", "qwen3", "-tokenizer", testfix.TokenizerDir(t, "qwen3")}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"-kv-hash-algo", "xxhash"}, "-kv-hash-seed"}, // PYTHONHASHSEED unset: no parity
		{[]string{"-kv-hash-algo", "sha256", "-kv-hash-seed", "\xff"}, "-kv-hash-seed"},
		{[]string{"-kv-hash-algo", "md5"}, "-kv-hash-algo"},
		{[]string{"-kv-hash-algo", "sha256-bigram"}, "-kv-hash-algo"}, // SGLang's, not vLLM's
	} {
		var stderr bytes.Buffer
		code := runServe(append(append([]string{}, rule...), tc.args...), nil, io.Discard, &stderr)
		if code != 2 || !strings.HasPrefix(stderr.String(), "kvgate serve: "+tc.flag+": hashcore: ") {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", tc.args, code, stderr.String(), tc.flag)
		}
	}
}
