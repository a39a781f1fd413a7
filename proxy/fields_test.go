package proxy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/hashcore"
	"github.com/kvgate/kvgate/proxy/openai"
	"github.com/kvgate/kvgate/tokenize"
)

// fieldCase is one request-field golden: a chat body, the prompt vLLM renders for it
// (Python Jinja2, tools/gen-field-goldens.py) and its HF-tokenizers token IDs
// (tools/gen-tok-fields.js). PrefixIDs: a media case's rendering before its first
// media placeholder.
type fieldCase struct {
	Name      string
	Model     string
	Path      string // "responses": a /v1/responses body
	Miss      string // the route of a body kvgate does not key
	Engine    string // "sglang": rendered the way SGLang does
	Request   string
	IDs       []uint32
	PrefixIDs []uint32
}

func fieldGoldens(t testing.TB) (cases []fieldCase, templates map[string]string) {
	t.Helper()
	var doc struct {
		Templates map[string]string `json:"templates"`
		Cases     []struct {
			Name    string  `json:"name"`
			Model   string  `json:"model"`
			Path    string  `json:"path"`
			Miss    string  `json:"miss"`
			Engine  string  `json:"engine"`
			Request string  `json:"request"`
			Prefix  *string `json:"prefix"`
		} `json:"cases"`
	}
	var ids struct {
		Cases []struct {
			Name      string   `json:"name"`
			IDs       []uint32 `json:"ids"`
			PrefixIDs []uint32 `json:"prefix_ids"`
		} `json:"cases"`
	}
	for path, v := range map[string]any{"../testdata/chat/fields.json": &doc, "../testdata/tokenize/fields.golden.json": &ids} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (regenerate with tools/goldens.sh)", err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	if len(doc.Cases) != len(ids.Cases) || len(doc.Cases) < 10 {
		t.Fatalf("%d rendered cases, %d tokenized", len(doc.Cases), len(ids.Cases))
	}
	for i, c := range doc.Cases {
		if ids.Cases[i].Name != c.Name {
			t.Fatalf("golden files disagree at %d: %s vs %s", i, c.Name, ids.Cases[i].Name)
		}
		fc := fieldCase{Name: c.Name, Model: c.Model, Path: c.Path, Miss: c.Miss, Engine: c.Engine, Request: c.Request, IDs: ids.Cases[i].IDs, PrefixIDs: ids.Cases[i].PrefixIDs}
		if c.Prefix != nil && fc.PrefixIDs == nil {
			fc.PrefixIDs = []uint32{}
		}
		cases = append(cases, fc)
	}
	return cases, doc.Templates
}

var (
	fieldPoolOnce sync.Once
	fieldPool     *tokenize.Pool
	fieldDirs     = map[string]string{}
	fieldPoolErr  error
)

// fieldModels serves qwen3 plus the goldens' own templates over the Qwen3 tokenizer (a
// directory with chat_template.jinja beside Qwen3's tokenizer files).
func fieldModels(t testing.TB, templates map[string]string) *tokenize.Pool {
	t.Helper()
	fieldPoolOnce.Do(func() {
		fieldPool = tokenize.NewPool()
		q := qwen3Dir(t)
		if fieldPoolErr = fieldPool.Add("qwen3", q); fieldPoolErr != nil {
			return
		}
		// Gemma 3's tokenizer adds <bos> (add_special_tokens cases).
		var g string
		if g, fieldPoolErr = tokenize.StagedDir("gemma3"); fieldPoolErr != nil {
			return
		}
		if fieldPoolErr = fieldPool.Add("gemma3", g); fieldPoolErr != nil {
			return
		}
		fieldDirs["gemma3"] = g
		root, err := os.MkdirTemp("", "kvgate-fields")
		if err != nil {
			fieldPoolErr = err
			return
		}
		for name, src := range templates {
			dir := filepath.Join(root, name)
			if fieldPoolErr = os.MkdirAll(dir, 0o755); fieldPoolErr != nil {
				return
			}
			for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
				if fieldPoolErr = os.Symlink(filepath.Join(q, f), filepath.Join(dir, f)); fieldPoolErr != nil {
					return
				}
			}
			if fieldPoolErr = os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(src), 0o644); fieldPoolErr != nil {
				return
			}
			if fieldPoolErr = fieldPool.Add(name, dir); fieldPoolErr != nil {
				return
			}
			fieldDirs[name] = dir
		}
	})
	if fieldPoolErr != nil {
		t.Fatal(fieldPoolErr)
	}
	return fieldPool
}

// fieldProxy is a KV-Exact proxy in front of one fake vLLM engine with a real ZeroMQ
// publisher, serving every model of the field goldens.
func fieldProxy(t *testing.T, templates map[string]string) (*Server, *kvEngine) {
	return fieldProxyFor(t, templates, "vllm")
}

func fieldProxyFor(t *testing.T, templates map[string]string, engine string) (*Server, *kvEngine) {
	t.Helper()
	flavor := enginepub.VLLM
	if engine == "sglang" {
		flavor = enginepub.SGLang
	}
	a := newKVEngine(t, "a", flavor)
	cfg := kvConfig(t, KVConverged, a.spec(0, engine, ""))
	if engine == "sglang" {
		cfg.KV.HashAlgo = "sha256"
	}
	pool := fieldModels(t, templates)
	for name, dir := range fieldDirs {
		cfg.Models.Tokenizers = append(cfg.Models.Tokenizers, TokenizerSpec{Model: name, Dir: dir})
	}
	s, err := New(cfg, Options{Logger: quietLog, Tokenizers: pool})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StartWith(context.Background(), listenLocal(t), listenLocal(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s, a
}

// explainBody asks /debug/explain where body would go.
func explainBody(t *testing.T, s *Server, body string) Explanation {
	t.Helper()
	res, out := post(t, s.admURL("/debug/explain"), body)
	var ex Explanation
	if err := json.Unmarshal([]byte(out), &ex); err != nil || res.StatusCode != 200 {
		t.Fatalf("explain: %d %s", res.StatusCode, out)
	}
	return ex
}

// withModel adds "model" to a golden's request fields.
func withModel(t *testing.T, c fieldCase) string {
	var req map[string]json.RawMessage
	if err := json.Unmarshal([]byte(c.Request), &req); err != nil {
		t.Fatal(err)
	}
	req["model"], _ = json.Marshal(c.Model)
	b, _ := json.Marshal(req)
	return string(b)
}

// publishOnly makes the engine's inventory exactly the first n blocks of ids.
func publishOnly(t *testing.T, s *Server, a *kvEngine, c hashcore.Chain, ids []uint32, n int) {
	t.Helper()
	s.kv.inv.ClearEndpoint(0)
	a.store(t, c, ids, n)
	waitFor(t, "events applied", func() bool { return s.kv.inv.Count(0) == n })
}

// Request-level template variables (documents, reasoning_effort and the enable_thinking it
// implies, add_generation_prompt: false) give the engine's exact prompt: an engine holding
// the oracle's blocks is a full-depth hit.
func TestRequestFieldsParityWithOracle(t *testing.T) {
	cases, templates := fieldGoldens(t)
	s, a := fieldProxy(t, templates)
	c := vllmChain(t)
	checked, misses := 0, 0
	for _, fc := range cases {
		if fc.PrefixIDs != nil || fc.Path == "responses" || fc.Engine != "" {
			continue // media: TestMediaPrefixKeys; Responses: TestResponsesParityWithOracle; SGLang: TestSGLangParityWithOracle
		}
		if fc.Miss != "" {
			if ex := explainBody(t, s, withModel(t, fc)); ex.Route != fc.Miss || ex.Tokens != 0 {
				t.Errorf("%s: route %s with %d tokens, want %s", fc.Name, ex.Route, ex.Tokens, fc.Miss)
			}
			misses++
			continue
		}
		blocks := len(fc.IDs) / blockSize
		if blocks == 0 {
			t.Fatalf("%s: golden has no full block", fc.Name)
		}
		publishOnly(t, s, a, c, fc.IDs, blocks)
		ex := explainBody(t, s, withModel(t, fc))
		if ex.Tokens != len(fc.IDs) || ex.Scores["a"] != blocks || ex.Route != "kv-hit" {
			t.Errorf("%s: tokens=%d score=%d route=%s, want tokens=%d score=%d kv-hit",
				fc.Name, ex.Tokens, ex.Scores["a"], ex.Route, len(fc.IDs), blocks)
		}
		checked++
	}
	if checked < 12 || misses < 3 {
		t.Fatalf("only %d field cases checked, %d misses", checked, misses)
	}
}

// A prompt with media is keyed up to its first media item: every keyed block is one the
// engine holds for that prompt (a wrong token would break the chain), nothing past the
// item is keyed, and when the first media message starts with its media the whole
// prefix but its last token is keyed.
func TestMediaPrefixKeys(t *testing.T) {
	cases, templates := fieldGoldens(t)
	s, a := fieldProxy(t, templates)
	c := vllmChain(t)
	checked, misses := 0, 0
	for _, fc := range cases {
		if fc.PrefixIDs == nil || fc.Path != "" {
			continue
		}
		// The engine holds every full block of the whole prompt; past the media item its
		// real blocks differ (expanded pads, the item's extra keys), so kvgate must
		// stop before it.
		blocks := len(fc.IDs) / blockSize
		publishOnly(t, s, a, c, fc.IDs, blocks)
		ex := explainBody(t, s, withModel(t, fc))
		if ex.Tokens > len(fc.PrefixIDs) {
			t.Errorf("%s: keyed %d tokens, past the first media item at %d", fc.Name, ex.Tokens, len(fc.PrefixIDs))
		}
		// The cut lies exactly at the first placeholder: in place for the openai-format
		// template (local_vl), at the content start (where vLLM puts the placeholders) for
		// string-format ones.
		exact := fc.Model == "local_vl" || strings.HasPrefix(fc.Name, "str_")
		if exact && ex.Tokens != len(fc.PrefixIDs)-1 && ex.Tokens >= blockSize {
			t.Errorf("%s: keyed %d tokens, want %d (the prefix less its last token)", fc.Name, ex.Tokens, len(fc.PrefixIDs)-1)
		}
		want := ex.Tokens / blockSize
		switch {
		case want == 0:
			if ex.Route != "kv-miss:media" {
				t.Errorf("%s: %d keyed tokens routed %s, want kv-miss:media", fc.Name, ex.Tokens, ex.Route)
			}
			misses++
		case ex.Scores["a"] != want || ex.Route != "kv-hit":
			t.Errorf("%s: score=%d route=%s for %d keyed tokens, want %d kv-hit", fc.Name, ex.Scores["a"], ex.Route, ex.Tokens, want)
		default:
			checked++
		}
	}
	if checked < 4 || misses < 1 {
		t.Fatalf("%d media cases hit, %d missed: the goldens lost their shapes", checked, misses)
	}
}

// Partial keying is counted: requests and keyed tokens; a request carrying the cut
// sentinel itself is not keyed.
func TestMediaPartialCounted(t *testing.T) {
	cases, templates := fieldGoldens(t)
	s, a := fieldProxy(t, templates)
	var fc fieldCase
	for _, c := range cases {
		if c.Name == "vl_image_after_turns" {
			fc = c
		}
	}
	c := vllmChain(t)
	publishOnly(t, s, a, c, fc.IDs, len(fc.PrefixIDs)/blockSize)
	ex := explainBody(t, s, withModel(t, fc))
	res, out := post(t, s.url("/v1/chat/completions"), withModel(t, fc))
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("send: %d route=%q %s", res.StatusCode, res.Header.Get("x-kvgate-route"), out)
	}
	_, metrics := get(t, s.admURL("/metrics"))
	for _, line := range []string{`kvgate_kv_partial_prompts_total{cut="media"} 1`,
		`kvgate_kv_partial_keyed_tokens_total{cut="media"} ` + strconv.Itoa(ex.Tokens)} {
		if !strings.Contains(metrics, line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	spoof := strings.Replace(withModel(t, fc), "What is it?", "What is \u2063kvgate:media-cut\u2063?", 1)
	if ex := explainBody(t, s, spoof); ex.Route != "kv-miss:media" || ex.Tokens != 0 {
		t.Errorf("a request holding the sentinel: route %s, %d tokens, want kv-miss:media and none keyed", ex.Route, ex.Tokens)
	}
}

// A request that brings its own chat template is an explicit, counted miss (and still
// served), whether at the top level or inside chat_template_kwargs; so is a
// reasoning_effort vLLM refuses.
func TestRequestTemplateAndBadEffortMiss(t *testing.T) {
	_, templates := fieldGoldens(t)
	s, _ := fieldProxy(t, templates)
	msgs := `"messages":[{"role":"user","content":"` + strings.Repeat("hello there ", 20) + `"}]`
	for _, tc := range []struct{ body, route string }{
		{`{"model":"qwen3",` + msgs + `,"chat_template":"{{ messages[0].content }}"}`, "kv-miss:request_template"},
		{`{"model":"qwen3",` + msgs + `,"chat_template_kwargs":{"chat_template":"x"}}`, "kv-miss:request_template"},
		{`{"model":"qwen3",` + msgs + `,"chat_template":null,"chat_template_kwargs":{"chat_template":null}}`, "kv-miss:no_worker"},
		{`{"model":"qwen3",` + msgs + `,"reasoning_effort":"extreme"}`, "kv-miss:tokenize"},
		{`{"model":"qwen3",` + msgs + `,"reasoning_effort":null}`, "kv-miss:no_worker"},
	} {
		if ex := explainBody(t, s, tc.body); ex.Route != tc.route {
			t.Errorf("%s: route %s, want %s", tc.body[len(tc.body)-60:], ex.Route, tc.route)
		}
	}
	res, out := post(t, s.url("/v1/chat/completions"), `{"model":"qwen3",`+msgs+`,"chat_template":"{{ messages[0].content }}"}`)
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != "kv-miss:request_template" {
		t.Fatalf("send: %d route=%q %s", res.StatusCode, res.Header.Get("x-kvgate-route"), out)
	}
	if n := s.m.misses[RouteMissRequestTemplate].Get(); n != 1 {
		t.Errorf("kv-miss:request_template counted %d, want 1", n)
	}
	// A member of another endpoint's type is the engine's to judge: forwarded, keyed
	// without it.
	res, out = post(t, s.url("/v1/chat/completions"), `{"model":"qwen3",`+msgs+`,"documents":"nope","reasoning":true,"input":7}`)
	if res.StatusCode != 200 {
		t.Fatalf("odd members: %d %s", res.StatusCode, out)
	}
}

// A batch prompt routes on its first element's exact keys and counts the others.
func TestBatchPromptFirstElement(t *testing.T) {
	_, templates := fieldGoldens(t)
	s, a := fieldProxy(t, templates)
	c := vllmChain(t)
	first := sharedPrefix + "Question one?"
	ids := engineTokens(t, first)
	publishOnly(t, s, a, c, ids, len(ids)/blockSize)
	for _, body := range []string{
		`{"model":"qwen3","prompt":` + jsonStr(first) + `}`,
		`{"model":"qwen3","prompt":[` + jsonStr(first) + `,"Question two?","Question three?"]}`,
	} {
		ex := explainBody(t, s, body)
		if ex.Tokens != len(ids) || ex.Scores["a"] != len(ids)/blockSize || ex.Route != "kv-hit" {
			t.Errorf("%.40s: tokens=%d score=%d route=%s, want %d tokens, %d blocks, kv-hit",
				body, ex.Tokens, ex.Scores["a"], ex.Route, len(ids), len(ids)/blockSize)
		}
	}
	tokList := func(ids []uint32) string { b, _ := json.Marshal(ids); return string(b) }
	res, out := post(t, s.url("/v1/completions"), `{"model":"qwen3","prompt":[`+tokList(ids)+`,[1,2,3]]}`)
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("token batch: %d route=%q %s", res.StatusCode, res.Header.Get("x-kvgate-route"), out)
	}
	res, out = post(t, s.url("/v1/completions"), `{"model":"qwen3","prompt":[`+jsonStr(first)+`,"a","b"]}`)
	if res.StatusCode != 200 || res.Header.Get("x-kvgate-route") != "kv-hit" {
		t.Fatalf("string batch: %d route=%q %s", res.StatusCode, res.Header.Get("x-kvgate-route"), out)
	}
	_, metrics := get(t, s.admURL("/metrics"))
	if !strings.Contains(metrics, "kvgate_kv_batch_unkeyed_prompts_total 3\n") {
		t.Errorf("/metrics: want kvgate_kv_batch_unkeyed_prompts_total 3 (1 + 2 unkeyed elements)")
	}
}

func jsonStr(s string) string { b, _ := json.Marshal(s); return string(b) }

// cutMessages rewrites only media: the first media message's content becomes the
// sentinel (string format) or every media part a sentinel text part (openai format),
// everything else byte for byte.
func TestCutMessages(t *testing.T) {
	inPlace := `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"b"}]}]`
	want := `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"` + mediaSentinel + `"},{"type":"text","text":"b"}]}]`
	if out, found := cutMessages(nil, []byte(inPlace), true); !found || string(out) != want {
		t.Errorf("in place:\n got %v %s\nwant %s", found, out, want)
	}
	for _, tc := range []struct{ in, want string }{
		{`[{"role":"user","content":"hi"}]`, ""},
		{`[{"role":"user","content":[{"type":"text","text":"a"}]}]`, ""},
		{`[{"role":"system","content":"s"}, {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}, {"role":"user","content":[{"type":"input_audio","input_audio":{}}, {"type":"text","text":"b"}]}]`,
			`[{"role":"system","content":"s"}, {"role":"user","content":"` + mediaSentinel + `"}, {"role":"user","content":[{"type":"text","text":"` + mediaSentinel + `"}, {"type":"text","text":"b"}]}]`},
		{`[{"role":"user","content":[{"image_url":{"url":"u"}}]}]`, `[{"role":"user","content":"` + mediaSentinel + `"}]`},
		{`[{"role":"user","content":[{"type":"video_url","video_url":{"url":"v"},"uuid":"x"}]},{"role":"assistant","content":"ok"}]`,
			`[{"role":"user","content":"` + mediaSentinel + `"},{"role":"assistant","content":"ok"}]`},
	} {
		out, found := cutMessages(nil, []byte(tc.in), false)
		if found != (tc.want != "") || (found && string(out) != tc.want) {
			t.Errorf("%s:\n got %v %s\nwant %s", tc.in, found, out, tc.want)
		}
	}
}

// A Responses API body is keyed as the conversation vLLM builds from it (instructions,
// input items, reasoning.effort, a message in progress continued); one that needs
// server-side history, tools or non-message items is kv-miss:responses.
func TestResponsesParityWithOracle(t *testing.T) {
	cases, templates := fieldGoldens(t)
	s, a := fieldProxy(t, templates)
	c := vllmChain(t)
	hits, media, misses := 0, 0, 0
	for _, fc := range cases {
		if fc.Path != "responses" {
			continue
		}
		explainURL := s.admURL("/debug/explain?path=chat") // Responses bodies route as chat
		send := func() Explanation {
			res, out := post(t, explainURL, withModel(t, fc))
			var ex Explanation
			if err := json.Unmarshal([]byte(out), &ex); err != nil || res.StatusCode != 200 {
				t.Fatalf("%s: explain %d %s", fc.Name, res.StatusCode, out)
			}
			return ex
		}
		if fc.Miss != "" {
			if ex := send(); ex.Route != fc.Miss || ex.Tokens != 0 {
				t.Errorf("%s: route %s with %d tokens, want %s", fc.Name, ex.Route, ex.Tokens, fc.Miss)
			}
			misses++
			continue
		}
		blocks := len(fc.IDs) / blockSize
		publishOnly(t, s, a, c, fc.IDs, blocks)
		ex := send()
		if fc.PrefixIDs != nil {
			if ex.Tokens != len(fc.PrefixIDs)-1 || ex.Tokens < blockSize || ex.Scores["a"] != ex.Tokens/blockSize || ex.Route != "kv-hit" {
				t.Errorf("%s: tokens=%d score=%d route=%s; the prefix before the image has %d tokens",
					fc.Name, ex.Tokens, ex.Scores["a"], ex.Route, len(fc.PrefixIDs))
			}
			media++
			continue
		}
		if ex.Tokens != len(fc.IDs) || ex.Scores["a"] != blocks || ex.Route != "kv-hit" {
			t.Errorf("%s: tokens=%d score=%d route=%s, want tokens=%d score=%d kv-hit",
				fc.Name, ex.Tokens, ex.Scores["a"], ex.Route, len(fc.IDs), blocks)
		}
		hits++
	}
	if hits < 4 || media < 1 || misses < 3 {
		t.Fatalf("%d hits, %d media, %d misses: the goldens lost their shapes", hits, media, misses)
	}
}

// FuzzFieldsRoute drives arbitrary bodies through the request-field paths (media cut,
// Responses conversion, batch prompts, template variables) of the KV router: nothing
// panics, a miss keys nothing, and a media prompt never keys more than its text.
func FuzzFieldsRoute(f *testing.F) {
	for _, seed := range []string{
		`{"model":"local_vl","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
		`{"model":"qwen3","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"image_url":{}},{"type":"input_audio"}]}],"reasoning_effort":"low"}`,
		`{"model":"qwen3","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"message","role":"assistant","status":"incomplete","content":[]}],"instructions":"x","reasoning":{"effort":"high"}}`,
		`{"model":"qwen3","input":"hello","previous_response_id":"r"}`,
		`{"model":"local_rag","messages":[{"role":"user","content":"q"}],"documents":[{"title":"t","text":"x"}],"chat_template_kwargs":{"enable_thinking":false}}`,
		`{"model":"qwen3","prompt":["a","b",["c"]]}`,
		`{"model":"qwen3","prompt":[[1,2],[3,"x"]]}`,
		`{"model":"qwen3","messages":[{"role":"user","content":[{"type":"text","text":"\u2063kvgate:media-cut\u2063"},{"type":"video_url"}]}]}`,
	} {
		f.Add([]byte(seed), true)
	}
	_, templates := fieldGoldens(f)
	pool := fieldModels(f, templates)
	cfg := Defaults()
	cfg.Health.Interval = 0
	cfg.KV.Mode, cfg.KV.BlockSize, cfg.KV.HashAlgo = KVConverged, blockSize, "sha256_cbor"
	cfg.Models.Tokenizers = []TokenizerSpec{{Model: "qwen3", Dir: qwen3Dir(f)}}
	ep, err := ParseEndpoint("name=a,url=http://127.0.0.1:9,engine=vllm,events=tcp://127.0.0.1:9")
	if err != nil {
		f.Fatal(err)
	}
	cfg.Fleet.Endpoints = []EndpointSpec{ep}
	for name, dir := range fieldDirs {
		cfg.Models.Tokenizers = append(cfg.Models.Tokenizers, TokenizerSpec{Model: name, Dir: dir})
	}
	s, err := New(cfg, Options{Logger: quietLog, Tokenizers: pool})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		st := s.getState()
		defer s.putState(st)
		st.body = append(st.body[:0], body...)
		if openai.Scan(st.body, &st.oa) != nil {
			return
		}
		st.chat = chat
		var d decision
		s.kv.route(st, s.baseEligible(st, st.eligible, nil), &d)
		if d.route == RouteMissMedia && len(st.tokens) != 0 {
			t.Fatalf("kv-miss:media with %d tokens keyed", len(st.tokens))
		}
		if len(st.tokens) > 4*len(body)+64 {
			t.Fatalf("%d tokens from a %d-byte body", len(st.tokens), len(body))
		}
	})
}

// In front of SGLang endpoints, chat fields SGLang renders differently from vLLM are an
// explicit miss; requests without them are keyed as before.
func TestSGLangFieldsMiss(t *testing.T) {
	a := newKVEngine(t, "a", enginepub.SGLang)
	cfg := kvConfig(t, KVConverged, a.spec(0, "sglang", ""))
	cfg.KV.HashAlgo = "sha256"
	s := startProxy(t, cfg)
	msgs := `"messages":[{"role":"user","content":"` + strings.Repeat("hello there ", 20) + `"}]`
	tools := `"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]`
	for _, tc := range []struct{ extra, route string }{
		{``, "kv-miss:no_worker"},
		{`,"add_special_tokens":true`, "kv-miss:no_worker"},
		{`,"documents":[{"title":"t","text":"x"}]`, "kv-miss:no_worker"},
		{`,"add_generation_prompt":false`, "kv-miss:no_worker"},
		{`,` + tools + `,"tool_choice":"none"`, "kv-miss:no_worker"},
		{`,` + tools + `,"tool_choice":"auto"`, "kv-miss:engine_fields"},
		{`,` + tools, "kv-miss:engine_fields"},
		{`,"reasoning_effort":"low"`, "kv-miss:engine_fields"},
		{`,"reasoning":{"effort":"high"}`, "kv-miss:engine_fields"},
		{`,"continue_final_message":true,"add_generation_prompt":false`, "kv-miss:engine_fields"},
		{`,` + tools + `,"tool_choice":{"type":"function","function":{"name":"f"}}`, "kv-miss:engine_fields"},
	} {
		if ex := explainBody(t, s, `{"model":"qwen3",`+msgs+tc.extra+`}`); ex.Route != tc.route {
			t.Errorf("%s: route %s, want %s", tc.extra, ex.Route, tc.route)
		}
	}
	res, out := post(t, s.admURL("/debug/explain?path=chat"), `{"model":"qwen3","input":"hello"}`)
	var ex Explanation
	if err := json.Unmarshal([]byte(out), &ex); err != nil || res.StatusCode != 200 || ex.Route != "kv-miss:responses" {
		t.Errorf("Responses body in front of SGLang: %d %s", res.StatusCode, out)
	}
	// A rule mixing vLLM and SGLang endpoints cannot key a field they render differently.
	b := newKVEngine(t, "b", enginepub.VLLM)
	mixedCfg := kvConfig(t, KVConverged, a.spec(0, "sglang", ""), b.spec(1, "vllm", ""))
	mixedCfg.KV.HashAlgo, mixedCfg.KV.Keys = "sha256", "rehash" // one rule, two engine contracts
	mixed := startProxy(t, mixedCfg)
	for _, extra := range []string{`,"documents":[{"title":"t","text":"x"}]`, `,"add_generation_prompt":false`,
		`,` + tools + `,"tool_choice":"none"`, `,"add_special_tokens":true`} {
		if ex := explainBody(t, mixed, `{"model":"qwen3",`+msgs+extra+`}`); ex.Route != "kv-miss:engine_fields" {
			t.Errorf("mixed rule %s: route %s, want kv-miss:engine_fields", extra, ex.Route)
		}
	}
	if ex := explainBody(t, mixed, `{"model":"qwen3",`+msgs+`}`); ex.Route == "kv-miss:engine_fields" {
		t.Errorf("mixed rule, plain chat: %s", ex.Route)
	}
}

// A rule of SGLang endpoints keys the prompt SGLang renders: a generation prompt always,
// no documents, no tools under tool_choice "none".
func TestSGLangParityWithOracle(t *testing.T) {
	cases, templates := fieldGoldens(t)
	s, a := fieldProxyFor(t, templates, "sglang")
	c, err := hashcore.New(hashcore.Spec{Engine: "sglang", Algo: "sha256", BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, fc := range cases {
		if fc.Engine != "sglang" {
			continue
		}
		blocks := len(fc.IDs) / blockSize
		publishOnly(t, s, a, c, fc.IDs, blocks)
		ex := explainBody(t, s, withModel(t, fc))
		if ex.Tokens != len(fc.IDs) || ex.Scores["a"] != blocks || ex.Route != "kv-hit" {
			t.Errorf("%s: tokens=%d score=%d route=%s, want tokens=%d score=%d kv-hit",
				fc.Name, ex.Tokens, ex.Scores["a"], ex.Route, len(fc.IDs), blocks)
		}
		checked++
	}
	if checked < 4 {
		t.Fatalf("only %d SGLang cases", checked)
	}
}
