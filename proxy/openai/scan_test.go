package openai

import (
	"encoding/json"
	"math/rand"
	"strings"
	"testing"
	"unicode/utf8"
)

const chatBody = `{"model":"qwen3","messages":[{"role":"system","content":"You are helpful."},
 {"role":"user","content":[{"type":"text","text":"hi \u00e9"}]}],"stream":true,
 "tools":[{"type":"function","function":{"name":"f","parameters":{}}}],
 "chat_template_kwargs":{"enable_thinking":false},"cache_salt":"s1","user":"u-7","max_tokens":32,
 "extra":[1,2.5e3,-0.1,null,true,false,{"a":{}}]}`

func TestScanChat(t *testing.T) {
	var r Request
	b := []byte(chatBody)
	if err := Scan(b, &r); err != nil {
		t.Fatal(err)
	}
	eq := func(f Field, want string) {
		t.Helper()
		if got := string(r.Value[f].Bytes(b)); got != want {
			t.Errorf("%s = %q, want %q", f.Name(), got, want)
		}
	}
	eq(FModel, `"qwen3"`)
	eq(FCacheSalt, `"s1"`)
	eq(FUser, `"u-7"`)
	eq(FMaxTokens, `32`)
	eq(FChatTemplateKwargs, `{"enable_thinking":false}`)
	if !r.Stream || !r.AddGenerationPrompt {
		t.Errorf("stream=%v agp=%v", r.Stream, r.AddGenerationPrompt)
	}
	// The spans must agree with encoding/json's view of the same body.
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range []Field{FMessages, FTools} {
		var a, c any
		json.Unmarshal(m[f.Name()], &a)
		if err := json.Unmarshal(r.Value[f].Bytes(b), &c); err != nil {
			t.Fatalf("%s span not JSON: %v", f.Name(), err)
		}
		ja, _ := json.Marshal(a)
		jc, _ := json.Marshal(c)
		if string(ja) != string(jc) {
			t.Errorf("%s: %s vs %s", f.Name(), ja, jc)
		}
	}
	sys := MessageContent(r.Value[FMessages].Bytes(b), "system")
	if string(sys) != `"You are helpful."` {
		t.Errorf("system = %q", sys)
	}
	user := MessageContent(r.Value[FMessages].Bytes(b), "user")
	if got := string(AppendUnquoted(nil, user)); got != "hi é" {
		t.Errorf("user = %q", got)
	}
}

func TestScanPromptKinds(t *testing.T) {
	cases := map[string]PromptKind{
		`{"prompt":"x"}`:         PromptString,
		`{"prompt":["x","y"]}`:   PromptStrings,
		`{"prompt":[1,2,3]}`:     PromptTokens,
		`{"prompt":[[1,2],[3]]}`: PromptBatch,
		`{"prompt":null}`:        PromptNone,
	}
	for body, want := range cases {
		var r Request
		if err := Scan([]byte(body), &r); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if r.Prompt != want {
			t.Errorf("%s: kind %d want %d", body, r.Prompt, want)
		}
	}
	toks, ok := AppendTokens(nil, []byte(`[[7, 8 ,9],[1]]`))
	if !ok || len(toks) != 3 || toks[0] != 7 || toks[2] != 9 {
		t.Errorf("tokens %v %v", toks, ok)
	}
	if _, ok := AppendTokens(nil, []byte(`[1,-2]`)); ok {
		t.Error("negative token accepted")
	}
}

// Every body encoding/json rejects, Scan must reject; every object it accepts, Scan accepts.
var validityCases = []string{
	`{}`, ` {"a":1} `, `{"a":[]}`, `{"a":"\ud83d\ude00"}`, `{"model":"m","stream":false}`,
	``, `{`, `}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":1 "b":2}`, `{"a":01}`, `{"a":1.}`,
	`{"a":-}`, `{"a":"\x"}`, `{"a":"` + "\x01" + `"}`, `{"a":"` + "\xff" + `"}`, `{"a":tru}`,
	`{"a":1}x`, `[1]`, `"s"`, `{"a":[1,]}`, `{"a":{"b":1,}}`, `{"a":1e}`, `{"a":"\u12"}`,
	`{"a":"x`, `{"a":[`, strings.Repeat(`[`, 200) + strings.Repeat(`]`, 200),
}

func TestScanValidity(t *testing.T) {
	for _, c := range validityCases {
		var r Request
		err := Scan([]byte(c), &r)
		valid := json.Valid([]byte(c)) && strings.HasPrefix(strings.TrimSpace(c), "{")
		if err == ErrUTF8 && !utf8.ValidString(c) {
			continue // stricter than encoding/json, as engines are: JSON text is UTF-8
		}
		if valid != (err == nil) {
			t.Errorf("%q: Scan err=%v, json.Valid object=%v", c, err, valid)
		}
	}
	var r Request
	deep := `{"a":` + strings.Repeat(`[`, MaxDepth+1) + strings.Repeat(`]`, MaxDepth+1) + `}`
	if err := Scan([]byte(deep), &r); err != ErrDepth {
		t.Errorf("deep: %v", err)
	}
	if err := Scan([]byte(`{"model":5}`), &r); err != ErrType {
		t.Errorf("model type: %v", err)
	}
	if err := Scan([]byte(`{"messages":{}}`), &r); err != ErrType {
		t.Errorf("messages type: %v", err)
	}
}

func TestRewrite(t *testing.T) {
	cases := []struct{ in, extra, want string }{
		{`{"model":"m","stream":true,"max_tokens":9}`, `"stream":false,"max_tokens":1`, `{"model":"m","stream":false,"max_tokens":1}`},
		{`{"stream":true, "model":"m"}`, `"x":1`, `{"model":"m","x":1}`},
		{`{"stream":true}`, `"x":1`, `{"x":1}`},
		{`{"stream":true}`, ``, `{}`},
		{`{"a":1, "stream":true , "max_tokens":3}`, ``, `{"a":1}`},
	}
	for _, c := range cases {
		var r Request
		if err := Scan([]byte(c.in), &r); err != nil {
			t.Fatal(err)
		}
		out := AppendRewritten(nil, []byte(c.in), &r, []byte(c.extra), FStream, FMaxTokens)
		var got, want any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s -> %s: %v", c.in, out, err)
		}
		json.Unmarshal([]byte(c.want), &want)
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if string(g) != string(w) {
			t.Errorf("%s -> %s, want %s", c.in, g, w)
		}
	}
}

func TestPathInt(t *testing.T) {
	body := []byte(`{"id":"x","usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}`)
	v := Path(body, "usage", "prompt_tokens_details", "cached_tokens")
	if n, ok := Int(v); !ok || n != 32 {
		t.Errorf("cached = %s", v)
	}
	if Path(body, "usage", "nope") != nil {
		t.Error("missing key found")
	}
}

func TestScanAllocs(t *testing.T) {
	b := []byte(chatBody)
	var r Request
	n := testing.AllocsPerRun(200, func() {
		if err := Scan(b, &r); err != nil {
			t.Fatal(err)
		}
		_ = MessageContent(r.Value[FMessages].Bytes(b), "system")
	})
	if n != 0 {
		t.Errorf("Scan allocates %v per run", n)
	}
	dst := make([]byte, 0, 4096)
	n = testing.AllocsPerRun(200, func() {
		dst = AppendRewritten(dst[:0], b, &r, []byte(`"stream":false`), FStream)
	})
	if n != 0 {
		t.Errorf("AppendRewritten allocates %v per run", n)
	}
}

func BenchmarkScanChat(b *testing.B) {
	body := []byte(chatBody)
	var r Request
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		Scan(body, &r)
	}
}

func FuzzScan(f *testing.F) {
	f.Add([]byte(chatBody))
	for _, c := range validityCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		err := Scan(b, &r)
		trimmed := strings.TrimLeft(string(b), " \t\r\n")
		valid := json.Valid(b) && strings.HasPrefix(trimmed, "{")
		if err == nil && !valid {
			t.Fatalf("Scan accepted invalid %q", b)
		}
		if err == nil {
			for f := Field(0); f < numFields; f++ {
				if s := r.Value[f]; s.Present() && !json.Valid(s.Bytes(b)) {
					t.Fatalf("%s span %q not JSON", f.Name(), s.Bytes(b))
				}
			}
			MessageContent(r.Value[FMessages].Bytes(b), "user")
			out := AppendRewritten(nil, b, &r, []byte(`"k":1`), FStream, FModel)
			if !json.Valid(out) {
				t.Fatalf("rewrite of %q gave %q", b, out)
			}
		}
		if valid && err != nil && err != ErrDepth && err != ErrType && (err != ErrUTF8 || utf8.Valid(b)) {
			t.Fatalf("Scan rejected valid %q: %v", b, err)
		}
	})
}

// Members one endpoint reads and others ignore take their JSON kinds; any other kind (or
// null) reads as absent, never as an error.
func TestScanLenientFields(t *testing.T) {
	for _, tc := range []struct {
		body string
		f    Field
		want string
	}{
		{`{"documents":[{"title":"t","text":"x"}]}`, FDocuments, `[{"title":"t","text":"x"}]`},
		{`{"documents":"x"}`, FDocuments, ``},
		{`{"documents":null}`, FDocuments, ``},
		{`{"reasoning_effort":"low"}`, FReasoningEffort, `"low"`},
		{`{"reasoning_effort":3}`, FReasoningEffort, ``},
		{`{"chat_template":"{{ x }}"}`, FChatTemplate, `"{{ x }}"`},
		{`{"chat_template":null}`, FChatTemplate, ``},
		{`{"input":"hi"}`, FInput, `"hi"`},
		{`{"input":[{"role":"user","content":"x"}]}`, FInput, `[{"role":"user","content":"x"}]`},
		{`{"input":{"a":1}}`, FInput, ``},
		{`{"reasoning":{"effort":"high"}}`, FReasoning, `{"effort":"high"}`},
		{`{"reasoning":true}`, FReasoning, ``},
		{`{"previous_response_id":"r1"}`, FPreviousResponseID, `"r1"`},
		{`{"previous_response":{"id":"r"}}`, FPreviousResponse, `{"id":"r"}`},
		{`{"previous_input_messages":[]}`, FPreviousInputMessages, `[]`},
		{`{"truncation":"auto"}`, FTruncation, `"auto"`},
		{`{"add_special_tokens":false}`, FAddSpecialTokens, `false`},
		{`{"add_special_tokens":"yes"}`, FAddSpecialTokens, ``},
		{`{"truncate_prompt_tokens":-1}`, FTruncatePromptTokens, `-1`},
		{`{"truncate_prompt_tokens":"8"}`, FTruncatePromptTokens, ``},
	} {
		var r Request
		b := []byte(tc.body)
		if err := Scan(b, &r); err != nil {
			t.Errorf("%s: %v", tc.body, err)
			continue
		}
		if got := string(r.Value[tc.f].Bytes(b)); got != tc.want {
			t.Errorf("%s: %s = %q, want %q", tc.body, tc.f.Name(), got, tc.want)
		}
	}
}

// TestScanStringsRandom checks the string scanner (vectorized quote and backslash search,
// eight-byte plain runs) against encoding/json and utf8.Valid on random strings holding
// quotes, backslashes, escapes, controls, multi-byte and broken UTF-8 at every alignment.
func TestScanStringsRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	pieces := []string{"a", "bcdefgh", " ", `\"`, `\\`, `\n`, `\u00e9`, `\ud83d\ude00`, "é", "😀", "\u2028",
		"\x01", "\x1f", "\x7f", "\xc3", "\xff", `\x`, `\u12`, `"`, `\`, strings.Repeat("plain text ", 3)}
	for n := 0; n < 20000; n++ {
		var sb strings.Builder
		sb.WriteString(`{"k":"`)
		for k := rng.Intn(12); k > 0; k-- {
			sb.WriteString(pieces[rng.Intn(len(pieces))])
		}
		sb.WriteString(`"}`)
		body := []byte(sb.String())
		var r Request
		err := Scan(body, &r)
		valid := json.Valid(body)
		if err == ErrUTF8 && !utf8.Valid(body) {
			continue
		}
		if valid != (err == nil) {
			t.Fatalf("%q: Scan err=%v, json.Valid=%v", body, err, valid)
		}
		if err == nil && !utf8.Valid(body) {
			t.Fatalf("%q: Scan accepted invalid UTF-8", body)
		}
	}
}

// BenchmarkScanLongChat scans a ~20 KB chat body (long plain-text contents, as
// BenchmarkRouteFollowup's).
func BenchmarkScanLongChat(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"qwen3","messages":[`)
	for i := 0; i < 25; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":"`)
		sb.WriteString(strings.Repeat("How does the prefix cache decide which blocks to keep when memory is tight? ", 10))
		sb.WriteString(`"}`)
	}
	sb.WriteString(`],"stream":true}`)
	body := []byte(sb.String())
	var r Request
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Scan(body, &r); err != nil {
			b.Fatal(err)
		}
	}
}

func TestHasElements(t *testing.T) {
	for v, want := range map[string]bool{`[]`: false, ` [ ] `: false, "[\n]": false, `[1]`: true,
		` [ {"role":"system","content":"long"} ]`: true, `{}`: false, ``: false, `"[x]"`: false} {
		if got := HasElements([]byte(v)); got != want {
			t.Errorf("HasElements(%q) = %v, want %v", v, got, want)
		}
		if got := FirstElement([]byte(v)) != nil; got != want && v != `"[x]"` {
			t.Errorf("FirstElement(%q) disagrees: %v", v, got)
		}
	}
}
