package chat

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestRenderAllocsBounded guards the per-render scratch: a ~4,000-token conversation (with
// tools where the template takes them) renders with no allocation once the pooled renderer
// has warmed up: values, dicts, call arguments and the strings the template builds ("+",
// captured blocks, decoded JSON escapes) all come from the pooled arena.
func TestRenderAllocsBounded(t *testing.T) {
	base := benchConversation()
	for _, model := range []string{"qwen3", "deepseek_v3", "gemma3", "llama3_1"} {
		t.Run(model, func(t *testing.T) {
			tmpl := mustCompile(t, loadChatTemplate(t, model))
			in := benchInputFor(model, base)
			want, err := tmpl.Render(nil, &in)
			if err != nil {
				t.Fatal(err)
			}
			var out []byte
			allocs := testing.AllocsPerRun(50, func() {
				out, err = tmpl.Render(out[:0], &in)
				if err != nil {
					t.Fatal(err)
				}
			})
			if string(out) != string(want) {
				t.Fatalf("steady-state render differs from the first render")
			}
			t.Logf("%.1f allocs per render of %d bytes", allocs, len(out))
			// The race detector makes sync.Pool drop objects at random, so a render may start
			// from a cold renderer; only bound the average there.
			limit := 0.0
			if raceEnabled {
				limit = 40
			}
			if allocs > limit {
				t.Errorf("%.1f allocations per render, want <= %.0f", allocs, limit)
			}
		})
	}
}

// TestRenderArenaStringsDoNotLeak: strings a render builds live in the pooled arena; what
// leaves Render (the output, an error message) must not change when later renders reuse it.
func TestRenderArenaStringsDoNotLeak(t *testing.T) {
	tmpl := mustCompile(t, `{% set s %}[{{ messages[0].content }}]{% endset %}`+
		`{% set t = s + "|" + messages[1].content %}{{ t }}`+
		`{% if messages|length > 2 %}{{ raise_exception("bad: " + t + messages[2].content) }}{% endif %}`)
	bad := &Input{Messages: []byte(`[{"role":"user","content":"a\"b"},{"role":"user","content":"c\u00e9d"},{"role":"user","content":"!\n"}]`)}
	// Longer than bad's strings, so later renders write over the arena bytes bad's used.
	good := &Input{Messages: []byte(`[{"role":"user","content":"` + strings.Repeat(`X\"Y`, 20) +
		`"},{"role":"user","content":"` + strings.Repeat(`Z\u00e0W`, 20) + `"}]`)}
	wantGood := "[" + strings.Repeat(`X"Y`, 20) + "]|" + strings.Repeat("Z\u00e0W", 20)
	_, err := tmpl.Render(nil, bad)
	if err == nil {
		t.Fatal("raise_exception did not fail the render")
	}
	var re *RenderError
	if !errors.As(err, &re) {
		t.Fatalf("error %v is not a *RenderError", err)
	}
	const wantMsg = "bad: [a\"b]|c\u00e9d!\n"
	if re.Msg != wantMsg {
		t.Fatalf("error message %q, want %q", re.Msg, wantMsg)
	}
	var out []byte
	for i := 0; i < 20; i++ {
		if out, err = tmpl.Render(out[:0], good); err != nil {
			t.Fatal(err)
		}
		if string(out) != wantGood {
			t.Fatalf("render %d: %q", i, out)
		}
	}
	if re.Msg != wantMsg {
		t.Fatalf("earlier error message changed to %q after later renders", re.Msg)
	}
}

// TestRenderStringBudget: a template that keeps rebuilding a big string goes past the
// per-render string slab budget (about 25 MB of intermediate strings here) and must still
// render correctly, the rest of its strings built on the heap.
func TestRenderStringBudget(t *testing.T) {
	const n = 5000
	tmpl := mustCompile(t, `{% set ns = namespace(s="") %}{% for m in messages %}{% for i in range(`+
		strconv.Itoa(n)+`) %}{% set ns.s = m.content + ns.s %}{% endfor %}{% endfor %}`+
		`{{ ns.s|length }} {{ ns.s[:4] }} {{ ns.s[-4:] }}`)
	in := &Input{Messages: []byte(`[{"role":"user","content":"a\"b"}]`)}
	for i := 0; i < 3; i++ {
		out, err := tmpl.Render(nil, in)
		if err != nil {
			t.Fatal(err)
		}
		if want := strconv.Itoa(3*n) + ` a"ba ba"b`; string(out) != want {
			t.Fatalf("render %d: %q, want %q", i, out, want)
		}
	}
}

// TestArenaConcatBudget: past maxRenderBytes the arena stops taking new slabs and concat
// still returns the right strings.
func TestArenaConcatBudget(t *testing.T) {
	var a arena
	s := ""
	for i := 0; i < 4000; i++ {
		s = a.concat("abcd", s)
	}
	if a.slabBytes > maxRenderBytes {
		t.Errorf("string slabs took %d bytes, budget %d", a.slabBytes, maxRenderBytes)
	}
	if 4*4000*4001/2 <= maxRenderBytes {
		t.Fatal("test does not reach the budget")
	}
	if s != strings.Repeat("abcd", 4000) {
		t.Error("concat past the budget built the wrong string")
	}
	a.reset()
	if x := a.concat("ab", "cd"); x != "abcd" {
		t.Errorf("after reset: %q", x)
	}
}
