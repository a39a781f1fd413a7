package proxy

import (
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// pyRead is what Python's json (vLLM's and SGLang's reader) makes of body, re-encoded
// with sorted keys.
func pyRead(t *testing.T, body string) map[string]any {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", "-c", "import json,sys; print(json.dumps(json.loads(sys.stdin.read()), sort_keys=True))")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 json.loads(%q): %v", body, err)
	}
	return decodeJSON(t, string(out))
}

// TestPDLegsOverrideEveryCopyOfAField: a client's body repeating stream, max_tokens or
// kv_transfer_params, or spelling them with escapes, must not override what kvgate sets
// on the P/D legs: the engine (Python's json) reads the last copy.
func TestPDLegsOverrideEveryCopyOfAField(t *testing.T) {
	p1, dec := newKVEngine(t, "p1", enginepub.VLLM), newKVEngine(t, "d1", enginepub.VLLM)
	p1.handle = func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"x","finish_reason":"length"}],"kv_transfer_params":`+vllmKTP+`}`)
		return true
	}
	cfg := kvConfig(t, KVDisaggregated, p1.spec(0, "vllm", ",role=prefill"), dec.spec(1, "vllm", ",role=decode"))
	s := startProxy(t, cfg)
	for _, body := range []string{
		`{"model":"qwen3","stream":true,"prompt":"hello","max_tokens":50,"stream":true}`,
		`{"model":"qwen3","str\u0065am":true,"prompt":"hello","max_tok\u0065ns":50}`,
		`{"model":"qwen3","prompt":"hello","kv_transfer_params":{"remote_host":"10.9.9.9"},"kv_transfer_params":{"remote_host":"10.9.9.9"}}`,
		`{"model":"qwen3","prompt":"hello","kv_transfer_p\u0061rams":{"remote_host":"10.9.9.9"}}`,
	} {
		res, out := post(t, s.url("/v1/completions"), body)
		if res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, res.StatusCode, out)
		}
		var pb, db string
		for _, r := range p1.requests() {
			pb = r.body
		}
		for _, r := range dec.requests() {
			db = r.body
		}
		p, d := pyRead(t, pb), pyRead(t, db)
		ktp, _ := p["kv_transfer_params"].(map[string]any)
		if p["stream"] != false || p["max_tokens"] != 1.0 || ktp["do_remote_decode"] != true {
			t.Errorf("%s\n prefill got %s\n the engine reads stream=%v max_tokens=%v kv_transfer_params=%v", body, pb, p["stream"], p["max_tokens"], p["kv_transfer_params"])
		}
		if dk, _ := d["kv_transfer_params"].(map[string]any); dk["remote_engine_id"] != "P-1" {
			t.Errorf("%s\n decode got %s\n the engine reads kv_transfer_params=%v", body, db, d["kv_transfer_params"])
		}
	}
}
