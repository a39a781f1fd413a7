package chat

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// manyKwargs returns a chat_template_kwargs object of n distinct unused keys, then tail.
func manyKwargs(n int, tail string) []byte {
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, `"k%d":%d,`, i, i)
	}
	b.WriteString(tail)
	b.WriteString("}")
	return []byte(b.String())
}

// A request with very many chat_template_kwargs keys bound each of them with a scan of all
// the others (and every read of a global scanned them all): quadratic in the keys, ~4 s for
// 40k keys, minutes for a few MB of body. Unused keys must not change the render either.
func TestManyKwargsLinear(t *testing.T) {
	tmpl := mustCompile(t, loadChatTemplate(t, "qwen3"))
	msgs := []byte(`[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"more"}]`)
	want, err := tmpl.Render(nil, &Input{Messages: msgs, Kwargs: []byte(`{"enable_thinking":false}`), AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200_000
	kw := manyKwargs(n, `"enable_thinking":false`)
	start := time.Now()
	got, err := tmpl.Render(nil, &Input{Messages: msgs, Kwargs: kw, AddGenerationPrompt: true})
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("render with %d kwargs took %v", n, d)
	}
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("render with many unused kwargs differs:\n%q\nwant\n%q", got, want)
	}
}

// Past the size where the root frame is indexed, kwargs still override the special tokens
// and globals, root-level sets still rebind, and macros still see the root frame.
func TestManyKwargsScoping(t *testing.T) {
	tmpl := mustCompile(t, `{% macro m() %}{{ k2 }}{{ bos_token }}{% endmacro %}{{ bos_token }}|{{ k1 }}|{% set k1 = 'set' %}{{ k1 }}|{% set fresh = 7 %}{{ fresh }}|{{ m() }}|{% for x in [1] %}{{ k2 }}{{ x }}{{ fresh }}{% endfor %}|{{ range(2) | list }}|{{ nope is defined }}`)
	for _, n := range []int{3, 500} {
		out, err := tmpl.Render(nil, &Input{Messages: []byte(`[]`), BOSToken: "<s>", Kwargs: manyKwargs(n, `"bos_token":"B"`)})
		if err != nil {
			t.Fatal(err)
		}
		if want := "B|1|set|7|2B|217|[0, 1]|False"; string(out) != want {
			t.Errorf("n=%d: got %q, want %q", n, out, want)
		}
	}
}

// Tool-call arguments made of many 17-key objects: each such dict the render memo keeps gets
// a map index, which the memo did not count, so the heap it kept was ~1.6x its bound.
func TestMemoDictIndexBound(t *testing.T) {
	_, tmpl := goldenTemplate(t, "qwen3")
	const bound = 1 << 20
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	memo := newTestMemo(t, bound)
	for c := 0; c < 300; c++ {
		var b strings.Builder
		b.WriteString("{")
		for d := 0; d < 100; d++ {
			if d > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"o%d":{`, d)
			for k := 0; k < 17; k++ {
				if k > 0 {
					b.WriteString(",")
				}
				fmt.Fprintf(&b, `"%c":%d`, 'a'+k, c)
			}
			b.WriteString("}")
		}
		b.WriteString("}")
		raw, _ := json.Marshal([]map[string]any{{"role": "user", "content": fmt.Sprint("q", c)},
			{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"type": "function", "id": "x",
				"function": map[string]any{"name": "f", "arguments": b.String()}}}}})
		want, err := tmpl.Render(nil, &Input{Messages: raw})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := tmpl.Render(nil, &Input{Messages: raw, Memo: memo}); err != nil || string(got) != string(want) {
			t.Fatalf("conversation %d differs with the memo (%v)", c, err)
		}
	}
	if st := memo.Stats(); st.Evictions == 0 || st.Bytes > bound {
		t.Fatalf("%+v", st)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > bound+320<<10 {
		t.Errorf("the heap grew by %d bytes for a %d-byte memo", grown, bound)
	}
	runtime.KeepAlive(memo)
}
