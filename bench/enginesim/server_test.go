package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/hashcore"
)

func launch(t *testing.T, sp Spec) *Sim {
	t.Helper()
	if sp.Listen == "" {
		sp.Listen = "127.0.0.1:0"
	}
	s, err := Launch(sp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func post(t *testing.T, url, body string) (int, []byte, http.Header) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

func ids(from, n int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, from+i)
	}
	b.WriteByte(']')
	return b.String()
}

type completion struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

func complete(t *testing.T, s *Sim, body string) completion {
	t.Helper()
	code, b, _ := post(t, s.URL()+"/v1/completions", body)
	if code != 200 {
		t.Fatalf("HTTP %d: %s", code, b)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return c
}

func TestCompletionsReportCachedTokens(t *testing.T) {
	s := launch(t, Spec{BlockSize: 16, NumBlocks: 64, HashAlgo: "sha256_cbor", DecodePerToken: 0})
	// 40 tokens = 2 full blocks of 16 + 8. Cold: 0 cached; warm: both blocks (32).
	body := `{"model":"sim","prompt":` + ids(1000, 40) + `,"max_tokens":3}`
	c := complete(t, s, body)
	if c.Usage.PromptTokens != 40 || c.Usage.PromptTokensDetails.CachedTokens != 0 || c.Usage.CompletionTokens != 3 {
		t.Fatalf("cold usage %+v", c.Usage)
	}
	if n := len(strings.Fields(c.Choices[0].Text)); n != 3 {
		t.Fatalf("text %q: %d words, want 3", c.Choices[0].Text, n)
	}
	if c = complete(t, s, body); c.Usage.PromptTokensDetails.CachedTokens != 32 {
		t.Fatalf("warm cached %d, want 32", c.Usage.PromptTokensDetails.CachedTokens)
	}
	// 32 tokens exactly: the last token must be computed, so only block 0 is reused.
	if c = complete(t, s, `{"prompt":`+ids(1000, 32)+`,"max_tokens":1}`); c.Usage.PromptTokensDetails.CachedTokens != 16 {
		t.Fatalf("block-aligned prompt cached %d, want 16", c.Usage.PromptTokensDetails.CachedTokens)
	}
	// Streaming: usage arrives in the last chunk when asked for.
	code, b, h := post(t, s.URL()+"/v1/completions", `{"prompt":[`+ids(1000, 40)[1:]+`,"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`)
	if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: HTTP %d %s", code, h.Get("Content-Type"))
	}
	chunks := strings.Split(strings.TrimSpace(string(b)), "\n\n")
	if len(chunks) != 4 || chunks[3] != "data: [DONE]" || !strings.Contains(chunks[2], `"cached_tokens":32`) || !strings.Contains(chunks[2], `"choices":[]`) {
		t.Fatalf("stream chunks %q", chunks)
	}
	// Bad input gets a clear error.
	for _, tc := range []struct {
		body string
		code int
	}{
		{`{"model":"other","prompt":[1,2]}`, 404},
		{`{"prompt":"text"}`, 400}, // no tokenizer: token ids only
		{`{"prompt":[1,2],"max_tokens":0}`, 400},
		{`not json`, 400},
		{`{"prompt":` + ids(0, 2000) + `}`, 400}, // more blocks than the pool
	} {
		if code, b, _ := post(t, s.URL()+"/v1/completions", tc.body); code != tc.code || !bytes.Contains(b, []byte(`"message"`)) {
			t.Errorf("%.40s: HTTP %d %s, want %d", tc.body, code, b, tc.code)
		}
	}
}

func TestChatAndModelsAndMetrics(t *testing.T) {
	s := launch(t, Spec{Encoder: WordEncoder{}, Model: "m", LoRAs: []string{"ad1"}, BlockSize: 4, NumBlocks: 64})
	msgs := `[{"role":"system","content":"a b c d e f g h"},{"role":"user","content":"hello there"}]`
	// WordEncoder: <system> + 8 words + <user> + 2 words + <assistant> = 13 tokens, 3 full blocks.
	code, b, _ := post(t, s.URL()+"/v1/chat/completions", `{"model":"m","messages":`+msgs+`,"max_tokens":2}`)
	if code != 200 || !bytes.Contains(b, []byte(`"prompt_tokens":13`)) || !bytes.Contains(b, []byte(`"role":"assistant"`)) {
		t.Fatalf("chat: %d %s", code, b)
	}
	code, b, _ = post(t, s.URL()+"/v1/chat/completions", `{"model":"m","messages":`+msgs+`,"max_tokens":2}`)
	if !bytes.Contains(b, []byte(`"cached_tokens":12`)) {
		t.Fatalf("chat repeat: %d %s", code, b)
	}
	// The LoRA adapter hashes its name into every block: nothing is shared with the base model.
	code, b, _ = post(t, s.URL()+"/v1/chat/completions", `{"model":"ad1","messages":`+msgs+`,"max_tokens":2}`)
	if code != 200 || !bytes.Contains(b, []byte(`"cached_tokens":0`)) {
		t.Fatalf("lora: %d %s", code, b)
	}
	resp, err := http.Get(s.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct{ ID, Parent string }
	}
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if len(models.Data) != 2 || models.Data[0].ID != "m" || models.Data[1].ID != "ad1" || models.Data[1].Parent != "m" {
		t.Fatalf("models %+v", models)
	}
	resp, err = http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`vllm:num_requests_running{model_name="m",engine="0"} 0`, `vllm:num_requests_waiting{model_name="m",engine="0"} 0`,
		`vllm:prefix_cache_queries_total{model_name="m",engine="0"} 39`, `vllm:prefix_cache_hits_total{model_name="m",engine="0"} 12`} {
		if !bytes.Contains(mb, []byte(want)) {
			t.Errorf("metrics lack %q:\n%s", want, mb)
		}
	}
	if r, err := http.Get(s.URL() + "/health"); err != nil || r.StatusCode != 200 {
		t.Fatalf("health: %v", err)
	}
}

func metric(t *testing.T, s *Sim, name string) string {
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, name+"{") {
			return l[strings.LastIndexByte(l, ' ')+1:]
		}
	}
	return ""
}

// With one batch slot, a second request waits in the queue while the first decodes.
func TestBatchSlotsQueue(t *testing.T) {
	s := launch(t, Spec{BlockSize: 4, NumBlocks: 64, MaxBatch: 1, DecodePerToken: 20 * time.Millisecond})
	done := make(chan struct{}, 2)
	for i := 0; i < 2; i++ {
		go func(i int) {
			http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":`+ids(i*100, 8)+`,"max_tokens":40}`))
			done <- struct{}{}
		}(i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, s, "vllm:num_requests_waiting") != "1" || metric(t, s, "vllm:num_requests_running") != "1" {
		if time.Now().After(deadline) {
			t.Fatalf("never saw 1 running + 1 waiting")
		}
		time.Sleep(2 * time.Millisecond)
	}
	<-done
	<-done
	// The handler releases its slot just after the client has its answer.
	for st := s.Stats(); st.Requests != 2 || st.Running != 0 || st.Waiting != 0; st = s.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want 2 requests, none running or waiting", st)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPrefillDecodeRoles(t *testing.T) {
	pre := launch(t, Spec{Name: "p0", Role: RolePrefill, BlockSize: 4, NumBlocks: 64})
	dec := launch(t, Spec{Name: "d0", Role: RoleDecode, BlockSize: 4, NumBlocks: 64})
	c := complete(t, pre, `{"prompt":`+ids(0, 10)+`,"max_tokens":50,"kv_transfer_params":{"do_remote_decode":true}}`)
	kv := c.KVTransferParams
	if c.Usage.CompletionTokens != 1 || kv["do_remote_prefill"] != true || kv["remote_engine_id"] != "p0" || len(kv["remote_block_ids"].([]any)) != 3 {
		t.Fatalf("prefill response: %+v", c)
	}
	kvb, _ := json.Marshal(kv)
	c = complete(t, dec, `{"prompt":`+ids(0, 10)+`,"max_tokens":5,"kv_transfer_params":`+string(kvb)+`}`)
	if c.Usage.CompletionTokens != 5 || c.KVTransferParams != nil {
		t.Fatalf("decode response: %+v", c)
	}
	if code, _, _ := post(t, dec.URL()+"/v1/completions", `{"prompt":[1,2],"kv_transfer_params":{"do_remote_decode":true}}`); code != 400 {
		t.Fatalf("do_remote_decode on a decode engine: HTTP %d, want 400", code)
	}
}

func TestTRTLLMDrain(t *testing.T) {
	s := launch(t, Spec{Engine: EngineTRTLLM, BlockSize: 4, NumBlocks: 64})
	complete(t, s, `{"prompt":`+ids(7, 9)+`,"max_tokens":1}`)
	code, b, _ := post(t, s.URL()+"/kv_cache_events", "")
	var evs []struct {
		EventID int64 `json:"event_id"`
		Data    struct {
			Type       string  `json:"type"`
			ParentHash *uint64 `json:"parent_hash"`
			Blocks     []struct {
				BlockHash uint64 `json:"block_hash"`
				Tokens    []struct {
					TokenID uint32 `json:"token_id"`
				} `json:"tokens"`
			} `json:"blocks"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &evs); err != nil || code != 200 {
		t.Fatalf("drain: %d %s %v", code, b, err)
	}
	if len(evs) != 2 || evs[0].Data.Type != "created" || evs[1].Data.Type != "stored" || evs[1].Data.ParentHash != nil || len(evs[1].Data.Blocks) != 2 {
		t.Fatalf("events %s", b)
	}
	if tok := evs[1].Data.Blocks[1].Tokens; len(tok) != 4 || tok[0].TokenID != 11 || tok[3].TokenID != 14 {
		t.Fatalf("block 1 tokens %+v, want 11..14", tok)
	}
	if _, b, _ = post(t, s.URL()+"/kv_cache_events", ""); string(b) != "[]" {
		t.Fatalf("second drain %s, want []", b)
	}
	resp, err := http.Get(s.URL() + "/server_info")
	if err != nil {
		t.Fatal(err)
	}
	info, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(info, []byte(`"tokens_per_block":4`)) {
		t.Fatalf("server_info %s", info)
	}
}

// pysub runs the pyzmq reader and returns its decoded lines as they arrive.
func pysub(t *testing.T, mode, addr string, arg int) <-chan map[string]any {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Fatal("/usr/bin/python3 missing: run `make fetch` (installs python3-zmq, python3-msgpack)")
	}
	cmd := exec.Command("/usr/bin/python3", "testdata/zmqsub.py", mode, addr, fmt.Sprint(arg))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	if !sc.Scan() || sc.Text() != "ready" {
		cmd.Wait()
		t.Fatalf("zmqsub.py did not start (run `make fetch` for python3-zmq/python3-msgpack): %s", stderr.String())
	}
	ch := make(chan map[string]any, 64)
	go func() {
		defer close(ch)
		for sc.Scan() {
			d := json.NewDecoder(strings.NewReader(sc.Text()))
			d.UseNumber()
			var m map[string]any
			if d.Decode(&m) == nil {
				ch <- m
			}
		}
	}()
	return ch
}

func recv(t *testing.T, ch <-chan map[string]any) map[string]any {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatal("subscriber ended early")
		}
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no batch within 20s")
	}
	return nil
}

func nums(t *testing.T, v any) []uint64 {
	t.Helper()
	var out []uint64
	for _, x := range v.([]any) {
		var u uint64
		if _, err := fmt.Sscan(string(x.(json.Number)), &u); err != nil {
			t.Fatalf("%v: %v", x, err)
		}
		out = append(out, u)
	}
	return out
}

// event returns the fields of one event in either layout, keyed by CONTRACTS.md's names.
func event(t *testing.T, v any) map[string]any {
	names := map[string][]string{
		"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
		"BlockRemoved":     {"block_hashes", "medium"},
		"AllBlocksCleared": {},
	}
	switch e := v.(type) {
	case map[string]any:
		e["tag"] = e["type"]
		return e
	case []any:
		m := map[string]any{"tag": e[0]}
		for i, n := range names[e[0].(string)] {
			if i+1 < len(e) {
				m[n] = e[i+1]
			}
		}
		return m
	}
	t.Fatalf("event %v", v)
	return nil
}

func testEventsLayout(t *testing.T, layout string) {
	s := launch(t, Spec{BlockSize: 4, NumBlocks: 4, HashAlgo: "sha256_cbor", Events: "tcp://127.0.0.1:0",
		Replay: "tcp://127.0.0.1:0", Topic: "kv", Layout: layout})
	ch := pysub(t, "sub", s.EventsAddr(), 3)
	if err := s.WaitSubscribed(context.Background(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	c, _ := hashcore.New(hashcore.Spec{Engine: "vllm", Algo: "sha256_cbor", BlockSize: 4})
	A, B := []uint32{1, 2, 3, 4, 5, 6, 7, 8}, []uint32{50, 51, 52, 53, 54, 55, 56, 57}
	ka, kb := hashcore.Keys(c, nil, A, nil), hashcore.Keys(c, nil, B, nil)
	complete(t, s, `{"prompt":[1,2,3,4,5,6,7,8],"max_tokens":1}`)         // stores A0, A1 (3 blocks of 4)
	complete(t, s, `{"prompt":[50,51,52,53,54,55,56,57],"max_tokens":1}`) // evicts A1, stores B0, B1
	post(t, s.URL()+"/reset_prefix_cache", "")

	b0 := recv(t, ch)
	if b0["seq"].(json.Number) != "0" || b0["frames"].(json.Number) != "3" {
		t.Fatalf("batch 0 header %v", b0)
	}
	batch := b0["batch"].([]any)
	if len(batch) != 3 {
		t.Fatalf("batch %v: want [ts, events, dp_rank]", batch)
	}
	evs := batch[1].([]any)
	e := event(t, evs[0])
	if len(evs) != 1 || e["tag"] != "BlockStored" || !slices.Equal(nums(t, e["block_hashes"]), ka) || e["parent_block_hash"] != nil ||
		!slices.Equal(nums(t, e["token_ids"]), []uint64{1, 2, 3, 4, 5, 6, 7, 8}) || e["block_size"].(json.Number) != "4" {
		t.Fatalf("batch 0 events %v, want BlockStored %v", evs, ka)
	}
	if ka[0] != 9561501211280363793 {
		t.Fatalf("key of [1,2,3,4] = %d, want CONTRACTS.md's 9561501211280363793", ka[0])
	}
	b1 := recv(t, ch)
	evs = b1["batch"].([]any)[1].([]any)
	rm, st := event(t, evs[0]), event(t, evs[1])
	if len(evs) != 2 || rm["tag"] != "BlockRemoved" || !slices.Equal(nums(t, rm["block_hashes"]), ka[1:]) ||
		st["tag"] != "BlockStored" || !slices.Equal(nums(t, st["block_hashes"]), kb) {
		t.Fatalf("batch 1 events %v: want BlockRemoved [%d], BlockStored %v", evs, ka[1], kb)
	}
	b2 := recv(t, ch)
	if evs = b2["batch"].([]any)[1].([]any); len(evs) != 1 || event(t, evs[0])["tag"] != "AllBlocksCleared" || b2["seq"].(json.Number) != "2" {
		t.Fatalf("batch 2 %v, want AllBlocksCleared seq 2", b2)
	}
	// Replay from seq 1: batches 1 and 2, then the end marker (newer layout: topic frame).
	rch := pysub(t, "replay", s.ReplayAddr(), 1)
	var seqs []string
	for {
		m := recv(t, rch)
		seqs = append(seqs, string(m["seq"].(json.Number)))
		if m["batch"] == nil {
			break
		}
		if m["frames"].(json.Number) != "4" {
			t.Fatalf("replay frames %v, want 4 (\"\", topic, seq, payload)", m["frames"])
		}
	}
	if !slices.Equal(seqs, []string{"1", "2", "18446744073709551615"}) {
		t.Fatalf("replay seqs %v", seqs)
	}
}

func TestEventsArrayLayoutPyzmq(t *testing.T) { testEventsLayout(t, "array") }
func TestEventsMapLayoutPyzmq(t *testing.T)   { testEventsLayout(t, "map") }

// SGLang: one BlockStored per page, keys are SGLang's signed page hashes.
func TestSGLangEventsPyzmq(t *testing.T) {
	s := launch(t, Spec{Engine: EngineSGLang, BlockSize: 4, NumBlocks: 16, Events: "tcp://127.0.0.1:0"})
	ch := pysub(t, "sub", s.EventsAddr(), 1)
	if err := s.WaitSubscribed(context.Background(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	complete(t, s, `{"prompt":[1,2,3,4,5,6,7,8,9],"max_tokens":1}`)
	evs := recv(t, ch)["batch"].([]any)[1].([]any)
	if len(evs) != 2 {
		t.Fatalf("events %v: want one BlockStored per page", evs)
	}
	e0, e1 := evs[0].([]any), evs[1].([]any)
	if e0[0] != "BlockStored" || string(e0[1].([]any)[0].(json.Number)) != "-3488128144981237669" || e0[2] != nil {
		t.Fatalf("page 0 %v: want CONTRACTS.md's -3488128144981237669, no parent", e0)
	}
	if e1[2].(json.Number) != "-3488128144981237669" {
		t.Fatalf("page 1 parent %v, want page 0's key", e1[2])
	}
}
