package openai

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// pyLoads decodes each body with Python's json module (what vLLM and SGLang read a
// request with: duplicate keys keep the last value, escapes in keys are decoded) and
// returns it re-encoded with sorted keys, or "ERROR" when Python refuses it.
func pyLoads(t *testing.T, bodies ...[]byte) []string {
	t.Helper()
	in, _ := json.Marshal(func() []string {
		s := make([]string, len(bodies))
		for i, b := range bodies {
			s[i] = string(b)
		}
		return s
	}())
	cmd := exec.Command("/usr/bin/python3", "-c", `
import json, sys
for b in json.load(sys.stdin):
    try:
        print(json.dumps(json.loads(b), sort_keys=True))
    except Exception:
        print("ERROR")
`)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("python3: %v", err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(bodies) {
		t.Fatalf("python3 gave %d lines for %d bodies", len(lines), len(bodies))
	}
	return lines
}

// TestScanKeysAsPythonReadsThem: the fields Scan reports are the ones Python's json gives
// the engine, for keys written with escapes and for members repeated (the last counts).
func TestScanKeysAsPythonReadsThem(t *testing.T) {
	cases := []struct {
		body   string
		stream bool
		model  string // the raw value Scan should report, "" when absent
		prompt string
	}{
		{`{"model":"m","str\u0065am":true,"prompt":"x"}`, true, `"m"`, `"x"`},
		{`{"\u006dodel":"m","\u0070rompt":"x"}`, false, `"m"`, `"x"`},
		{`{"model":"a","prompt":"x","m\u006fdel":"b"}`, false, `"b"`, `"x"`},
		{`{"stream":true,"model":"m","stream":null}`, false, `"m"`, ``},
		{`{"stream":true,"model":"m","stream":false}`, false, `"m"`, ``},
		{`{"model":"m","model":null}`, false, ``, ``},
		{`{"model":"m","\u0073tream":true,"stream":null}`, false, `"m"`, ``},
		{`{"str\\u0065am":true,"model":"m"}`, false, `"m"`, ``}, // a backslash, not an escape of e
	}
	for _, c := range cases {
		var r Request
		b := []byte(c.body)
		if err := Scan(b, &r); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		if r.Stream != c.stream {
			t.Errorf("%s: Stream = %v, Python reads %v", c.body, r.Stream, c.stream)
		}
		if got := string(r.Value[FModel].Bytes(b)); got != c.model {
			t.Errorf("%s: model = %q, Python reads %q", c.body, got, c.model)
		}
		if got := string(r.Value[FPrompt].Bytes(b)); got != c.prompt {
			t.Errorf("%s: prompt = %q, Python reads %q", c.body, got, c.prompt)
		}
	}
}

// TestRewriteReplacesEveryCopy: a rewrite that drops a field and inserts kvgate's own
// value (the P/D prefill leg's stream, max_tokens, kv_transfer_params) leaves no copy of
// the client's member behind, whether repeated or spelled with escapes: Python keeps
// the last member, so a surviving copy after kvgate's would win.
func TestRewriteReplacesEveryCopy(t *testing.T) {
	extra := `"kv_transfer_params":{"do_remote_decode":true},"stream":false,"max_tokens":1`
	drop := []Field{FKVTransferParams, FStream, FStreamOptions, FMaxTokens}
	bodies := []string{
		`{"model":"m","stream":true,"prompt":"x","stream":true}`,
		`{"stream":true,"stream":true,"stream":true}`,
		`{"model":"m","str\u0065am":true,"max_tok\u0065ns":50,"prompt":"x"}`,
		`{"max_tokens":9,"model":"m","max_tokens":7,"kv_transfer_params":{"a":1},"kv_transfer_params":{"b":2}}`,
		`{"kv_transfer_\u0070arams":{"do_remote_decode":false,"remote_host":"evil"},"model":"m"}`,
		`{"stream_options":{"include_usage":true},"model":"m","stream_options":null,"str\u0065am":true}`,
		` {"model":"\u00e9","stream" : true , "n":1e3,"x":-0,"stream":true } `,
	}
	var ins, outs [][]byte
	for _, body := range bodies {
		var r Request
		b := []byte(body)
		if err := Scan(b, &r); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		ins = append(ins, b)
		outs = append(outs, AppendRewritten(nil, b, &r, []byte(extra), drop...))
	}
	all := pyLoads(t, append(ins, outs...)...)
	for i, body := range bodies {
		got := all[len(bodies)+i]
		if got == "ERROR" {
			t.Errorf("%s -> %s: not JSON to Python", body, outs[i])
			continue
		}
		var in, out map[string]any
		json.Unmarshal([]byte(all[i]), &in)
		json.Unmarshal([]byte(got), &out)
		want := map[string]any{}
		for k, v := range in {
			want[k] = v
		}
		for _, f := range drop {
			delete(want, f.Name())
		}
		want["kv_transfer_params"] = map[string]any{"do_remote_decode": true}
		want["stream"], want["max_tokens"] = false, 1.0
		wj, _ := json.Marshal(want)
		gj, _ := json.Marshal(out)
		if string(wj) != string(gj) {
			t.Errorf("%s\n rewritten %s\n Python reads %s\n want %s", body, outs[i], gj, wj)
		}
	}
}

// TestEscapedKeysAllocFree: decoding an escaped key for its field allocates nothing, and
// the decode buffer fits every field name written wholly in \u escapes.
func TestEscapedKeysAllocFree(t *testing.T) {
	for f := Field(0); f < numFields; f++ {
		if n := 6*len(f.Name()) + 2; n > maxEscKey {
			t.Errorf("%s escaped takes %d bytes > maxEscKey %d", f.Name(), n, maxEscKey)
		}
	}
	var esc strings.Builder
	for _, c := range "previous_input_messages" {
		fmt.Fprintf(&esc, `\u%04x`, c)
	}
	b := []byte(`{"mod\u0065l":"m","str\u0065am":true,"` + esc.String() + `":[]}`)
	var r Request
	if err := Scan(b, &r); err != nil || !r.Stream || !r.Value[FModel].Present() || !r.Value[FPreviousInputMessages].Present() {
		t.Fatalf("err=%v stream=%v spans=%v", err, r.Stream, r.Value)
	}
	if n := testing.AllocsPerRun(100, func() { Scan(b, &r) }); n != 0 {
		t.Errorf("Scan allocates %v per run", n)
	}
}

// TestMemberAsPythonReadsIt: the member Member (and Path) finds in a request's nested
// objects (a message's role and content, a part's type, chat_template_kwargs'
// chat_template) is the one Python's json gives the engine: escapes in names decoded, the
// last of a repeated name.
func TestMemberAsPythonReadsIt(t *testing.T) {
	objs := []string{
		`{"chat_template":null,"chat_template":"{{ 'X' }}"}`,
		`{"chat_t\u0065mplate":"{{ 'X' }}"}`,
		`{"role":"user","content":"a","r\u006fle":"assistant"}`,
		`{"type":"text","text":"hi","type":"image_url"}`,
		`{"type":"image_url","image_url":{"url":"u"},"type":"text","text":"hi"}`,
		`{"t\\u0065xt":"not text","text":"text"}`,
	}
	keys := []string{"chat_template", "chat_template", "role", "type", "type", "text"}
	var bodies [][]byte
	for _, o := range objs {
		bodies = append(bodies, []byte(o))
	}
	py := pyLoads(t, bodies...)
	for i, o := range objs {
		var m map[string]any
		json.Unmarshal([]byte(py[i]), &m)
		want, _ := json.Marshal(m[keys[i]])
		var got any
		json.Unmarshal(Path([]byte(o), keys[i]), &got)
		g, _ := json.Marshal(got)
		if string(g) != string(want) {
			t.Errorf("%s: Path(%q) = %s, Python reads %s", o, keys[i], g, want)
		}
	}
	// The engine's disaggregated_params keep one request_type, whatever the spelling.
	out := AppendObjectWith(nil, []byte(`{"request_typ\u0065":"context_only","ctx":1}`), "request_type", []byte(`"generation_only"`))
	if got := pyLoads(t, out)[0]; got != `{"ctx": 1, "request_type": "generation_only"}` {
		t.Errorf("AppendObjectWith: %s reads as %s", out, got)
	}
}
