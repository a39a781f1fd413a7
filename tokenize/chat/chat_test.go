package chat

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestCompileErrors(t *testing.T) {
	bad := []string{
		"{% if x %}no end",
		"{% endif %}",
		"{% for x in %}{% endfor %}",
		"{% for in xs %}{% endfor %}",
		"{{ }}",
		"{{ 'unterminated }}",
		"{{ a | }}",
		"{{ a + }}",
		"{% set %}",
		"{% macro %}{% endmacro %}",
		"{% unknown_tag %}",
		"{{ x ) }}",
		"{{ (x }}",
		"{# unclosed comment",
		"{% raw %}never closed",
		"{{ x is }}",
		"{% if x %}{% else %}{% else %}{% endif %}",
		"{% for x in y recursive %}{% endfor %}",
		"{{ a.0x }}",
		"{{ 1 $ 2 }}",
	}
	for _, src := range bad {
		tmpl, err := Compile(src)
		if err == nil {
			t.Errorf("Compile(%q) succeeded, want a syntax error", src)
			continue
		}
		var se *SyntaxError
		if !errors.As(err, &se) || se.Line < 1 {
			t.Errorf("Compile(%q) error %v is not a *SyntaxError with a line", src, err)
		}
		if tmpl != nil {
			t.Errorf("Compile(%q) returned a template with an error", src)
		}
	}
}

const miniTemplate = `{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}
{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}`

func mustCompile(t testing.TB, src string) *Template {
	t.Helper()
	tmpl, err := Compile(src)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return tmpl
}

func TestRenderInputErrors(t *testing.T) {
	tmpl := mustCompile(t, miniTemplate)
	cases := []struct {
		name string
		in   *Input
	}{
		{"nil input", nil},
		{"no messages", &Input{}},
		{"truncated messages", &Input{Messages: []byte(`[{"role":"user","content":"hi"`)}},
		{"messages not an array", &Input{Messages: []byte(`{"role":"user"}`)}},
		{"message not an object", &Input{Messages: []byte(`["hi"]`)}},
		{"missing role", &Input{Messages: []byte(`[{"content":"hi"}]`)}},
		{"role not a string", &Input{Messages: []byte(`[{"role":1,"content":"hi"}]`)}},
		{"content a number", &Input{Messages: []byte(`[{"role":"user","content":5}]`)}},
		{"image part", &Input{Messages: []byte(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`)}},
		{"trailing garbage", &Input{Messages: []byte(`[] x`)}},
		{"bad escape", &Input{Messages: []byte(`[{"role":"user","content":"\q"}]`)}},
		{"tool_calls not array", &Input{Messages: []byte(`[{"role":"assistant","content":"","tool_calls":{}}]`)}},
		{"tool call without function", &Input{Messages: []byte(`[{"role":"assistant","content":"","tool_calls":[{"id":"1"}]}]`)}},
		{"tools not array", &Input{Messages: []byte(`[{"role":"user","content":"hi"}]`), Tools: []byte(`{}`)}},
		{"tool without name", &Input{Messages: []byte(`[{"role":"user","content":"hi"}]`), Tools: []byte(`[{"type":"function","function":{}}]`)}},
		{"kwargs not object", &Input{Messages: []byte(`[{"role":"user","content":"hi"}]`), Kwargs: []byte(`[1]`)}},
		{"kwargs bad json", &Input{Messages: []byte(`[{"role":"user","content":"hi"}]`), Kwargs: []byte(`{`)}},
		{"kwargs chat_template", &Input{Messages: []byte(`[{"role":"user","content":"hi"}]`), Kwargs: []byte(`{"chat_template":"x"}`)}},
		{"kwargs messages", &Input{Messages: []byte(`[{"role":"user","content":"hi"}]`), Kwargs: []byte(`{"messages":[]}`)}},
		{"kwargs tools", &Input{Messages: []byte(`[{"role":"user","content":"hi"}]`), Kwargs: []byte(`{"tools":[]}`)}},
		{"continue and generation prompt", &Input{Messages: []byte(`[{"role":"user","content":"hi"}]`), AddGenerationPrompt: true, ContinueFinalMessage: true}},
		{"deep nesting", &Input{Messages: []byte(strings.Repeat("[", 10000) + strings.Repeat("]", 10000))}},
		{"huge integer", &Input{Messages: []byte(`[{"role":"user","content":"hi","x":123456789012345678901234567890}]`)}},
	}
	for _, c := range cases {
		dst := []byte("keep")
		out, err := tmpl.Render(dst, c.in)
		if err == nil {
			t.Errorf("%s: Render succeeded: %q", c.name, out)
			continue
		}
		if string(out) != "keep" {
			t.Errorf("%s: dst changed on error: %q", c.name, out)
		}
		if strings.Contains(err.Error(), "internal error") {
			t.Errorf("%s: engine panicked: %v", c.name, err)
		}
	}
}

func TestRenderPreprocessing(t *testing.T) {
	tmpl := mustCompile(t, miniTemplate)
	in := &Input{
		Messages: []byte(`[{"role":"user","content":[{"type":"text","text":"a"},"b",{"type":"text","text":null},{"type":"text","text":"c"}]},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"z\": 1, \"a\": \"é\"}"}}]}]`),
		Tools:               []byte(`[{"type":"function","function":{"parameters":{"b":1,"a":2},"name":"f","strict":true}}]`),
		AddGenerationPrompt: true,
		BOSToken:            "<s>",
	}
	out, err := tmpl.Render(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	// Text parts join with "\n" (a null text part is skipped); null content becomes ""; the
	// arguments string becomes an object in its own key order; tools take model_dump()'s
	// field order with a null description and the extra field last.
	// (trim_blocks eats the newline after each {% endif %}.)
	want := "<s><user>a\nb\nc<assistant>{\"z\": 1, \"a\": \"é\"}" +
		`[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"b": 1, "a": 2}, "strict": true}}]` +
		"<assistant>"
	if string(out) != want {
		t.Errorf("got  %q\nwant %q", out, want)
	}
}

// TestContinueFinalMessageMissing: a template that drops the final message's text cannot be
// continued (transformers raises the same).
func TestContinueFinalMessageMissing(t *testing.T) {
	tmpl := mustCompile(t, `{% for m in messages %}<{{ m.role }}>{% endfor %}`)
	out, err := tmpl.Render([]byte("x"), &Input{
		Messages:             []byte(`[{"role":"user","content":"hi"},{"role":"assistant","content":"partial answer"}]`),
		ContinueFinalMessage: true,
	})
	if err == nil || string(out) != "x" {
		t.Fatalf("got %q, %v; want an error and dst unchanged", out, err)
	}
}

func TestRequestFieldsOverrideKwargs(t *testing.T) {
	tmpl := mustCompile(t, `[{{ documents }}|{{ reasoning_effort }}]`)
	in := &Input{Messages: []byte(`[]`), Kwargs: []byte(`{"documents": [1], "reasoning_effort": "low"}`)}
	for _, c := range []struct {
		docs   string
		effort string
		want   string
	}{
		{"", "", "[[1]|low]"},
		{"null", "auto", "[[1]|low]"},
		{`[{"title": "t"}]`, "high", "[[{'title': 't'}]|high]"},
	} {
		in.Documents, in.ReasoningEffort = nil, c.effort
		if c.docs != "" {
			in.Documents = []byte(c.docs)
		}
		out, err := tmpl.Render(nil, in)
		if err != nil || string(out) != c.want {
			t.Errorf("documents=%s effort=%q: got %q, %v; want %q", c.docs, c.effort, out, err, c.want)
		}
	}
}

func TestSpecialTokensAndKwargs(t *testing.T) {
	tmpl := mustCompile(t, `[{{ bos_token is defined }}|{{ eos_token }}|{{ pad_token }}|{{ flag }}|{{ add_generation_prompt }}|{{ tools }}|{{ documents }}]`)
	in := &Input{
		Messages: []byte(`[]`),
		EOSToken: "</s>",
		Special:  map[string]string{"pad_token": "<pad>", "eos_token": "ignored"},
		// Request kwargs override special tokens, but not apply_chat_template's own parameters.
		Kwargs:              []byte(`{"flag": {"x": [1]}, "pad_token": "<P>", "add_generation_prompt": false, "documents": [{"t": 1}]}`),
		AddGenerationPrompt: true,
	}
	out, err := tmpl.Render(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[False|</s>|<P>|{'x': [1]}|True|None|[{'t': 1}]]"; string(out) != want {
		t.Errorf("got %q want %q", out, want)
	}
}

func TestContentFormatDetection(t *testing.T) {
	cases := []struct {
		src  string
		want ContentFormat
	}{
		{`{% for m in messages %}{{ m.content }}{% endfor %}`, ContentString},
		{`{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for p in m['content'] | reverse %}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{% set a = messages %}{% set b = a|list %}{% for m in b %}{% for p in m.content %}{% endfor %}{% endfor %}`, ContentOpenAI},
		{`{% for m in other %}{% for p in m.content %}{% endfor %}{% endfor %}`, ContentString},
		{`{% for m in messages %}{% for p in m.parts %}{% endfor %}{% endfor %}`, ContentString},
		{`{% for m in messages %}{% set content = m.content %}{% for item in content %}{% endfor %}{% endfor %}`, ContentOpenAI},
		// vLLM's detector asserts a plain name target; a tuple target makes it fall back.
		{`{% for i, m in messages %}{% for p in m.content %}{% endfor %}{% endfor %}`, ContentString},
	}
	for _, c := range cases {
		if got := mustCompile(t, c.src).ContentFormat(); got != c.want {
			t.Errorf("%s: got %v want %v", c.src, got, c.want)
		}
	}
}

func TestResourceLimits(t *testing.T) {
	for _, src := range []string{
		`{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`,
		`{{ range(1000000)|length }}`,
		`{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}`,
		`{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}`,
	} {
		_, err := mustCompile(t, src).Render(nil, &Input{Messages: []byte(`[]`)})
		var re *RenderError
		if !errors.As(err, &re) {
			t.Errorf("%s: want a RenderError, got %v", src, err)
		}
	}
}

func TestRaiseExceptionMessage(t *testing.T) {
	_, err := mustCompile(t, `{{ raise_exception("roles must alternate") }}`).Render(nil, &Input{Messages: []byte(`[]`)})
	if err == nil || !strings.Contains(err.Error(), "roles must alternate") {
		t.Fatalf("got %v", err)
	}
}

func TestStrftimeUsesInputClock(t *testing.T) {
	out, err := mustCompile(t, `{{ strftime_now("%d %b %Y") }}`).Render(nil, &Input{Messages: []byte(`[]`), Now: fixedNow})
	if err != nil || string(out) != "26 Jul 2024" {
		t.Fatalf("got %q, %v", out, err)
	}
}

// TestConcurrentRender shares one Template across goroutines; -race checks the sharing and
// every output must equal the sequential one.
func TestConcurrentRender(t *testing.T) {
	tmpl := mustCompile(t, loadChatTemplate(t, "qwen3"))
	inputs := make([]*Input, 16)
	want := make([]string, len(inputs))
	for i := range inputs {
		inputs[i] = &Input{
			Messages:            []byte(fmt.Sprintf(`[{"role":"system","content":"sys %d"},{"role":"user","content":"question %d"},{"role":"assistant","content":"<think>r%d</think>answer"},{"role":"user","content":"again %d"}]`, i, i, i, i)),
			Kwargs:              []byte(fmt.Sprintf(`{"enable_thinking": %v}`, i%2 == 0)),
			AddGenerationPrompt: true,
			EOSToken:            "<|im_end|>",
		}
		out, err := tmpl.Render(nil, inputs[i])
		if err != nil {
			t.Fatal(err)
		}
		want[i] = string(out)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var buf []byte
			for n := 0; n < 200; n++ {
				i := (g + n) % len(inputs)
				var err error
				buf, err = tmpl.Render(buf[:0], inputs[i])
				if err != nil {
					t.Error(err)
					return
				}
				if string(buf) != want[i] {
					t.Errorf("goroutine %d: output differs for input %d", g, i)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

func FuzzCompileRender(f *testing.F) {
	for _, s := range []string{
		miniTemplate,
		`{% for x in xs if x %}{{ loop.index }}{{ x|tojson(indent=2) }}{% else %}e{% endfor %}`,
		`{%- set ns = namespace(a=1) -%}{% set ns.a = ns.a + 1 %}{{ ns.a }}{{ 'x'[::-1] }}`,
		`{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ m(1) }}{% raw %}{{{% endraw %}`,
		`{{ "a\u00e9" | upper | length }}{# c #}{{ d.items()|list }}{{ 1/0 }}`,
	} {
		f.Add(s)
	}
	vars := []byte(`{"xs": [1, "a", null, {"k": [1.5]}], "d": {"a": 1}, "messages": [{"role": "user", "content": "hi"}]}`)
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src)
		if err != nil {
			return
		}
		_, err = tmpl.renderVars(nil, vars, fixedNow, nil)
		if err != nil && strings.Contains(err.Error(), "internal error") {
			t.Fatalf("panic rendering %q: %v", src, err)
		}
	})
}

func FuzzMessages(f *testing.F) {
	f.Add([]byte(`[{"role":"user","content":"hi"}]`), []byte(`{"enable_thinking":false}`))
	f.Add([]byte(`[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":[1,{}]}"}}]}]`), []byte(nil))
	f.Add([]byte(`[{"role":"user","content":[{"type":"text","text":"\u00e9\ud83d\ude00"}]},{"role":"tool","content":"x"}]`), []byte(`{}`))
	tmpl := mustCompile(f, loadChatTemplate(f, "qwen3"))
	f.Fuzz(func(t *testing.T, msgs, kwargs []byte) {
		_, err := tmpl.Render(nil, &Input{Messages: msgs, Kwargs: kwargs, AddGenerationPrompt: true})
		if err != nil && strings.Contains(err.Error(), "internal error") {
			t.Fatalf("panic on %q / %q: %v", msgs, kwargs, err)
		}
	})
}

// renderExpr renders a template that reads no request data.
func renderExpr(t *testing.T, src string) (string, error) {
	t.Helper()
	out, err := mustCompile(t, src).Render(nil, &Input{Messages: []byte(`[]`)})
	return string(out), err
}

// checkRenders wants each template's output (expected values checked against Jinja2 3.1).
func checkRenders(t *testing.T, cases map[string]string) {
	t.Helper()
	for src, want := range cases {
		if out, err := renderExpr(t, src); err != nil || out != want {
			t.Errorf("%s = %q, %v; want %q", src, out, err, want)
		}
	}
}

// checkRefuses wants each template to fail with an error containing what.
func checkRefuses(t *testing.T, what string, srcs ...string) {
	t.Helper()
	for _, src := range srcs {
		if _, err := renderExpr(t, src); err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("%s: err %v, want one containing %q", src, err, what)
		}
	}
}

// Integer powers are exact for small operands and take O(log e) steps for huge exponents
// (before, `x ** 1e18` looped 1e18 times: a template could hang a request).
func TestIntegerPower(t *testing.T) {
	checkRenders(t, map[string]string{
		"{{ 2 ** 10 }}":   "1024",
		"{{ 3 ** 0 }}":    "1",
		"{{ (-2) ** 3 }}": "-8",
		"{{ 7 ** 1 }}":    "7",
		"{{ 10 ** 18 }}":  "1000000000000000000",
		"{{ 2 ** -1 }}":   "0.5",
		"{{ 1 ** 1000000000000000000 }}{{ (-1) ** 999999999999999999 }}": "1-1",
	})
}

// Repetition is bounded like the output: a huge count is an error, never an
// out-of-memory crash or a long loop; Python's results for small counts.
func TestRepetitionBounded(t *testing.T) {
	checkRenders(t, map[string]string{
		"{{ 'ab' * 3 }}":             "ababab",
		"{{ 2 * 'x' }}":              "xx",
		"{{ 'x' * -1 }}|":            "|",
		"{{ ([1, 2] * 2)|length }}":  "4",
		"{{ ([] * 10**15)|length }}": "0",
		"{{ ('' * 10**15)|length }}": "0",
	})
	checkRefuses(t, "repetition", "{{ 'x' * 10**12 }}", "{{ ([1] * 10**12)|length }}")
}

// Width arguments are bounded like the output (a huge width is an error, never an
// out-of-memory crash); a negative one pads nothing, as Python's " " * -1 does.
func TestWidthsBounded(t *testing.T) {
	checkRenders(t, map[string]string{
		`{{ "a\nb"|indent(-1) }}`: "a\nb",
		`{{ "a\nb"|indent(2) }}`:  "a\n  b",
		`{{ "x"|center(5) }}`:     "  x  ",
		`{{ "-7".zfill(4) }}`:     "-007",
	})
	checkRefuses(t, "larger than", `{{ "x"|indent(10**12) }}`, `{{ "x"|center(10**12) }}`,
		`{{ "x".zfill(10**12) }}`, `{{ [1]|tojson(indent=10**12) }}`)
}
