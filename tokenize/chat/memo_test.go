package chat

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func newTestMemo(t testing.TB, bytes int64) *RenderMemo {
	m, err := NewRenderMemo(bytes)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// goldenTemplate compiles a golden file's template (fetched or written for the tests).
func goldenTemplate(t testing.TB, model string) (*goldenFile, *Template) {
	var g goldenFile
	readGolden(t, model+".json", &g)
	src := ""
	if g.Template != nil {
		src = *g.Template
	} else {
		src = loadChatTemplate(t, model)
	}
	sum := sha256.Sum256([]byte(src))
	if hex.EncodeToString(sum[:]) != g.TemplateSHA256 {
		t.Fatalf("%s: fetched template differs from the goldens'", model)
	}
	return &g, mustCompile(t, src)
}

// TestMemoMatchesJinja2 renders every golden case three times through one memo shared by all
// templates and cases (the first pass fills it, the others replay) and requires Jinja2's
// bytes each time, and Jinja2's refusals to stay refusals.
func TestMemoMatchesJinja2(t *testing.T) {
	memo := newTestMemo(t, 8<<20)
	replayed := 0
	for pass := 0; pass < 3; pass++ {
		for _, model := range goldenModels {
			g, tmpl := goldenTemplate(t, model)
			for i := range g.Cases {
				c := &g.Cases[i]
				in := inputFor(g, c)
				var use MemoUse
				in.Memo, in.MemoUse = memo, &use
				out, err := tmpl.Render([]byte("PREFIX"), in)
				if c.Expected == nil {
					if err == nil {
						t.Errorf("%s/%s pass %d: Jinja2 refused (%s) but the memo render succeeded", model, c.Name, pass, c.Error)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s/%s pass %d: %v", model, c.Name, pass, err)
				} else if string(out) != "PREFIX"+*c.Expected {
					t.Errorf("%s/%s pass %d: mismatch\n got: %q\nwant: %q", model, c.Name, pass, out[6:], *c.Expected)
				}
				if pass > 0 {
					replayed += use.Replayed
				}
			}
		}
	}
	if replayed == 0 {
		t.Fatal("no iteration was replayed: the test proves nothing")
	}
	t.Logf("%d iterations replayed; %+v", replayed, memo.Stats())
}

// TestMemoEngineGoldens runs the engine's Jinja2 goldens (loop controls, namespaces,
// loop.cycle, macros, scoping) twice through one memo: the replays must give Jinja2's bytes.
func TestMemoEngineGoldens(t *testing.T) {
	var g struct {
		Cases []struct {
			Name     string  `json:"name"`
			Template string  `json:"template"`
			Vars     string  `json:"vars"`
			Expected *string `json:"expected"`
		} `json:"cases"`
	}
	readGolden(t, "engine.json", &g)
	memo := newTestMemo(t, 4<<20)
	for pass := 0; pass < 2; pass++ {
		for _, c := range g.Cases {
			tmpl, err := Compile(c.Template)
			if err != nil {
				continue
			}
			out, err := tmpl.renderVars(nil, []byte(c.Vars), fixedNow, memo)
			if c.Expected == nil {
				if err == nil {
					t.Errorf("%s: Jinja2 raised but we rendered %q", c.Name, out)
				}
				continue
			}
			if err != nil || string(out) != *c.Expected {
				t.Errorf("%s pass %d: got %q, %v; want %q", c.Name, pass, out, err, *c.Expected)
			}
		}
	}
	// Each Compile makes new loop statements, so pass 2 misses; replay a compiled one.
	for _, c := range g.Cases {
		tmpl, err := Compile(c.Template)
		if err != nil || c.Expected == nil {
			continue
		}
		for pass := 0; pass < 2; pass++ {
			out, err := tmpl.renderVars(nil, []byte(c.Vars), fixedNow, memo)
			if err != nil || string(out) != *c.Expected {
				t.Errorf("%s replay %d: got %q, %v; want %q", c.Name, pass, out, err, *c.Expected)
			}
		}
	}
}

// randomConversation builds n messages in the shapes chat templates meet: system prompts
// (sometimes mid-conversation), user turns, assistant turns with reasoning_content and tool
// calls, tool responses, repeated texts (so items collide on purpose).
func randomConversation(rng *rand.Rand, n int, system bool) []map[string]any {
	words := []string{"alpha", "beta", "<think>x</think>", "</think>", "tool", "\n", "é", "{\"a\": 1}", "  ", "<tool_response>", "</tool_response>"}
	text := func() string {
		var b strings.Builder
		for i := rng.IntN(6); i >= 0; i-- {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	var msgs []map[string]any
	if system {
		msgs = append(msgs, map[string]any{"role": "system", "content": "You are " + text()})
	}
	for len(msgs) < n {
		switch k := rng.IntN(10); {
		case k < 4:
			msgs = append(msgs, map[string]any{"role": "user", "content": text()})
		case k < 6:
			m := map[string]any{"role": "assistant", "content": text()}
			if rng.IntN(2) == 0 {
				m["reasoning_content"] = text()
			}
			msgs = append(msgs, m)
		case k < 8:
			calls := []any{}
			for j := rng.IntN(2); j >= 0; j-- {
				calls = append(calls, map[string]any{"id": fmt.Sprintf("c%d", j), "type": "function",
					"function": map[string]any{"name": "get_weather", "arguments": `{"city": "` + text() + `"}`}})
			}
			msgs = append(msgs, map[string]any{"role": "assistant", "content": "", "tool_calls": calls})
			for j := rng.IntN(2); j >= 0; j-- {
				msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": "c0", "content": text()})
			}
		case k < 9:
			msgs = append(msgs, map[string]any{"role": "system", "content": text()})
		default:
			msgs = append(msgs, map[string]any{"role": "user", "content": "<tool_response>" + text() + "</tool_response>"})
		}
	}
	return msgs
}

var memoTestTools = []byte(`[{"type":"function","function":{"name":"get_weather","description":"Get the weather.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`)

// TestMemoMultiTurnDifferential renders random conversations turn after turn (every prefix,
// with and without the generation prompt, tools on some) through one memo and requires the
// bytes (or the refusal) of the render without a memo.
func TestMemoMultiTurnDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 14))
	convs := 12
	if testing.Short() {
		convs = 4
	}
	for _, model := range goldenModels {
		g, tmpl := goldenTemplate(t, model)
		memo := newTestMemo(t, 2<<20)
		replayed := 0
		for c := 0; c < convs; c++ {
			msgs := randomConversation(rng, 14, c%3 != 0)
			var tools []byte
			if c%2 == 0 {
				tools = memoTestTools
			}
			kw := []byte(nil)
			if c%4 == 1 {
				kw = []byte(`{"enable_thinking": false}`)
			}
			for n := 1; n <= len(msgs); n++ {
				raw, _ := json.Marshal(msgs[:n])
				for _, gen := range []bool{true, false} {
					in := inputFor(g, &goldenCase{AddGenerationPrompt: gen})
					in.Messages, in.Tools, in.Kwargs = raw, tools, kw
					want, werr := tmpl.Render(nil, in)
					var use MemoUse
					in.Memo, in.MemoUse = memo, &use
					got, gerr := tmpl.Render(nil, in)
					if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
						t.Fatalf("%s conv %d turn %d: error %v with the memo, %v without", model, c, n, gerr, werr)
					}
					if string(got) != string(want) {
						t.Fatalf("%s conv %d turn %d gen %v: memo render differs\n got: %q\nwant: %q", model, c, n, gen, got, want)
					}
					replayed += use.Replayed
				}
			}
		}
		if replayed == 0 && model != "gemma3" {
			t.Errorf("%s: nothing replayed", model)
		}
		t.Logf("%s: %d iterations replayed, %+v", model, replayed, memo.Stats())
	}
}

// statefulTemplate's iterations depend on loop.last, loop.index0 against a namespace value
// computed by a reversed pre-scan, a namespace counter the iterations themselves advance, and
// the next message: every one a recorded read.
const statefulTemplate = `{%- set ns = namespace(last_user=-1, count=0) -%}
{%- for m in messages[::-1] -%}{%- if ns.last_user < 0 and m.role == "user" -%}{%- set ns.last_user = (messages|length - 1) - loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
{%- if m.role == "user" %}{%- set ns.count = ns.count + 1 -%}{%- endif -%}
[{{ m.role }}#{{ ns.count }}{% if loop.index0 > ns.last_user %} after{% endif %}{% if loop.last %} last{% endif %}{% if not loop.last and messages[loop.index0 + 1].role == m.role %} same-next{% endif %}: {{ m.content }}]
{%- endfor -%}`

// TestMemoRecordedReadsMatter: the stateful template's follow-up renders through the memo
// match the memo-less ones; and, to show the check can fail, the same replays with the
// records' reads stripped do not.
func TestMemoRecordedReadsMatter(t *testing.T) {
	tmpl := mustCompile(t, statefulTemplate)
	turns := [][]map[string]any{}
	msgs := []map[string]any{}
	for _, m := range []map[string]any{{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
		{"role": "user", "content": "c"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}} {
		msgs = append(msgs, m)
		turns = append(turns, append([]map[string]any(nil), msgs...))
	}
	run := func(memo *RenderMemo, strip bool) (diffs int) {
		for _, conv := range turns {
			raw, _ := json.Marshal(conv)
			want, err := tmpl.Render(nil, &Input{Messages: raw})
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.Render(nil, &Input{Messages: raw, Memo: memo})
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				diffs++
			}
			if strip {
				stripReads(memo)
			}
		}
		return diffs
	}
	if d := run(newTestMemo(t, 1<<20), false); d != 0 {
		t.Fatalf("%d follow-up renders differ from the memo-less ones", d)
	}
	if d := run(newTestMemo(t, 1<<20), true); d == 0 {
		t.Fatal("with the recorded reads stripped the replays still matched: the test cannot see a skipped read")
	}
}

// stripReads deletes the recorded reads of every iteration entry in place (test only; no
// render runs concurrently).
func stripReads(m *RenderMemo) {
	for i := range m.slots {
		if e := m.slots[i].Load(); e != nil && e.loop != nil {
			kept := e.ev[:0]
			for _, x := range e.ev {
				if x.e == nil {
					kept = append(kept, x)
				}
			}
			e.ev = kept
		}
	}
}

// TestMemoBoundUnderChurn feeds memos unique conversations: the bytes they count never
// pass the bound, they evict, the generations' entry counts are the list's, and the heap
// the memo keeps (measured after a collection) stays within the bound.
func TestMemoBoundUnderChurn(t *testing.T) {
	_, tmpl := goldenTemplate(t, "qwen3")
	for _, bound := range []int64{MinRenderMemoBytes, 1 << 20} {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		memo := newTestMemo(t, bound)
		rng := rand.New(rand.NewPCG(1, 2))
		for c := 0; c < 400; c++ {
			msgs := randomConversation(rng, 8, true)
			msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("unique %d %s", c, strings.Repeat("z", rng.IntN(2000)))})
			raw, _ := json.Marshal(msgs)
			want, werr := tmpl.Render(nil, &Input{Messages: raw})
			for pass := 0; pass < 2; pass++ {
				got, gerr := tmpl.Render(nil, &Input{Messages: raw, Memo: memo})
				if string(got) != string(want) || (werr == nil) != (gerr == nil) {
					t.Fatalf("bound %d conversation %d differs with the memo", bound, c)
				}
			}
			if b := memo.Stats().Bytes; b > bound {
				t.Fatalf("conversation %d: %d bytes, bound %d", c, b, bound)
			}
		}
		st := memo.Stats()
		if st.Evictions == 0 || st.Hits == 0 {
			t.Fatalf("bound %d: %+v", bound, st)
		}
		live := map[*memoGen]int{}
		for e := memo.list.next; e != &memo.list; e = e.next {
			live[e.gen]++
			if memo.slots[e.slot].Load() != e {
				t.Fatal("an entry on the list lost its slot")
			}
		}
		for i, g := range memo.gens {
			if g.live == 0 && i < len(memo.gens)-1 {
				t.Fatal("an empty old generation is still counted")
			}
			if live[g] != g.live {
				t.Fatalf("a generation counts %d entries, the list holds %d", g.live, live[g])
			}
			delete(live, g)
		}
		if len(live) != 0 {
			t.Fatal("entries of a forgotten generation are on the list")
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > bound+512<<10 {
			t.Errorf("bound %d: the heap grew by %d bytes", bound, grown)
		}
		runtime.KeepAlive(memo)
		t.Logf("bound %d: %+v, %d generations", bound, st, len(memo.gens))
	}
}

// TestMemoHitAllocs: a render served from the memo allocates nothing.
func TestMemoHitAllocs(t *testing.T) {
	base := benchConversation()
	for _, model := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		t.Run(model, func(t *testing.T) {
			tmpl := mustCompile(t, loadChatTemplate(t, model))
			in := benchInputFor(model, base)
			want, err := tmpl.Render(nil, &in)
			if err != nil {
				t.Fatal(err)
			}
			var use MemoUse
			in.Memo, in.MemoUse = newTestMemo(t, 8<<20), &use
			out, _ := tmpl.Render(nil, &in)
			allocs := testing.AllocsPerRun(50, func() {
				use = MemoUse{}
				if out, err = tmpl.Render(out[:0], &in); err != nil {
					t.Fatal(err)
				}
			})
			if string(out) != string(want) {
				t.Fatal("memo render differs")
			}
			// Iterations without output are not stored (commit), the rest replay.
			if use.Replayed == 0 || use.Replayed < use.Iterations-2 {
				t.Fatalf("replayed %d of %d iterations", use.Replayed, use.Iterations)
			}
			limit := 0.0
			if raceEnabled {
				limit = 40
			}
			if allocs > limit {
				t.Errorf("%.1f allocations per memo render, want <= %.0f", allocs, limit)
			}
		})
	}
}

// FuzzRenderMemo: any messages array renders through a memo (twice: filling, then replaying)
// exactly as without one, for the golden templates.
func FuzzRenderMemo(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 8; i++ {
		raw, _ := json.Marshal(randomConversation(rng, 1+i, i%2 == 0))
		f.Add(uint8(i), raw)
	}
	f.Add(uint8(0), []byte(`[{"role":"user","content":"a"} , {"role":"user","content":[{"type":"text","text":"b"}]}]`))
	f.Add(uint8(1), []byte(`[{"role":"developer","content":"d"},{"role":"user","content":"u"}]`))
	type tm struct {
		g *goldenFile
		t *Template
	}
	var tmpls []tm
	for _, model := range goldenModels {
		g, t := goldenTemplate(f, model)
		tmpls = append(tmpls, tm{g, t})
	}
	memo := newTestMemo(f, 1<<20)
	f.Fuzz(func(t *testing.T, which uint8, raw []byte) {
		x := tmpls[int(which)%len(tmpls)]
		in := inputFor(x.g, &goldenCase{AddGenerationPrompt: which&0x80 != 0})
		in.Messages = raw
		want, werr := x.t.Render(nil, in)
		in.Memo = memo
		for pass := 0; pass < 2; pass++ {
			got, gerr := x.t.Render(nil, in)
			if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
				t.Fatalf("pass %d: error %v with the memo, %v without", pass, gerr, werr)
			}
			if string(got) != string(want) {
				t.Fatalf("pass %d: memo render differs\n got: %q\nwant: %q", pass, got, want)
			}
		}
	})
}

// TestMemoConcurrent: goroutines render overlapping conversations turn by turn through one
// small memo (inserts, evictions and copies forward racing lock-free lookups); every render
// matches the memo-less one.
func TestMemoConcurrent(t *testing.T) {
	_, tmpl := goldenTemplate(t, "qwen3")
	memo := newTestMemo(t, 256<<10)
	rng := rand.New(rand.NewPCG(9, 9))
	shared := randomConversation(rng, 6, true)
	var convs [][]byte
	var wants [][]byte
	for c := 0; c < 24; c++ {
		msgs := append(append([]map[string]any(nil), shared...), randomConversation(rng, 2+c%7, false)...)
		for n := 1; n <= len(msgs); n++ {
			raw, _ := json.Marshal(msgs[:n])
			want, err := tmpl.Render(nil, &Input{Messages: raw, AddGenerationPrompt: true})
			if err != nil {
				continue
			}
			convs, wants = append(convs, raw), append(wants, want)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var out []byte
			for k := 0; k < 3*len(convs); k++ {
				i := (k*7 + w*13) % len(convs)
				var err error
				out, err = tmpl.Render(out[:0], &Input{Messages: convs[i], AddGenerationPrompt: true, Memo: memo})
				if err != nil || string(out) != string(wants[i]) {
					errs <- fmt.Sprintf("worker %d render %d differs (%v)", w, i, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	st := memo.Stats()
	t.Logf("%+v", st)
	if st.Hits == 0 || st.Evictions == 0 || st.Bytes > 256<<10 {
		t.Errorf("%+v", st)
	}
}

// trickyTemplates are loops whose iterations read outside state in every way the engine
// offers (each must replay exactly or not be stored).
var trickyTemplates = map[string]string{
	"tojson-output":   `{% for m in messages %}{{ tools | tojson }}|{{ m.content }}{% endfor %}`,
	"chain-output":    `{% for m in messages %}{{ bos_token + eos_token }}{{ bos_token ~ m.role }}{% endfor %}`,
	"read-before-set": `{% for m in messages %}[{{ x }}]{% if m.role == "user" %}{% set x = m.content %}{% endif %}{{ x }}{% endfor %}`,
	"cycle":           `{% for m in messages %}{{ loop.cycle("a", "b", "c") }}{{ m.role }}{% endfor %}`,
	"macro":           `{% macro show(m) %}{{ m.role }}{{ extra }}{% set ns.n = ns.n + 1 %}{% endmacro %}{% set ns = namespace(n=0) %}{% for m in messages %}{{ show(m) }}{{ ns.n }}{% endfor %}`,
	"ns-alias":        `{% set ns = namespace(n=0) %}{% for m in messages %}{% set a = ns %}{% set b = [ns] %}{{ a.n }}{{ b[0].n }}{% set ns.n = ns.n + m.content|length %}{% endfor %}{{ ns.n }}`,
	"neighbours":      `{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined }}>{{ m.role }}>{{ loop.nextitem.content if loop.nextitem is defined }};{% endfor %}`,
	"break-continue":  `{% for m in messages %}{% if m.role == "tool" %}{% continue %}{% endif %}{% if m.content == "stop" %}{% break %}{% endif %}{{ loop.index }}{{ m.content }}{% endfor %}`,
	"nested":          `{% for m in messages %}{% for c in (m.tool_calls or []) %}{{ loop.index }}/{{ loop.length }}{{ c.function.name }}{% endfor %}{{ loop.revindex }}{% endfor %}`,
	"filtered":        `{% for m in messages if m.role != "system" %}{{ loop.index }}:{{ loop.length }}:{{ m.role }} {% else %}none{% endfor %}`,
	"kwargs":          `{% for m in messages %}{% if enable_thinking is defined and enable_thinking %}T{% endif %}{{ m.role }}{{ add_generation_prompt }}{% endfor %}`,
	"ns-writes":       `{% set ns = namespace(last=-1, seen="") %}{% for m in messages %}{% if m.role == "user" %}{% set ns.last = loop.index0 %}{% set ns.seen = ns.seen + m.content[:3] %}{% endif %}{{ ns.last }}{{ ns.seen }}{% endfor %}`,
	"dict-items":      `{% for m in messages %}{% for k, v in m.items() %}{{ k }}={{ v if v is string else v|length }},{% endfor %}{% endfor %}`,
	"ns-after":        `{% set ns = namespace(n=0, s="") %}{% for m in messages %}{{ m.role }}{% set ns.n = ns.n + 1 %}{% if m.role == "user" %}{% set ns.s = m.content %}{% endif %}{% endfor %}|{{ ns.n }}|{{ ns.s }}`,
	"strftime":        `{% for m in messages %}{{ strftime_now("%Y") }}{{ m.role }}{% endfor %}`,
}

// TestMemoTrickyTemplates renders random conversations turn after turn with each tricky
// template through one memo, with kwargs and tools that change between turns, against the
// memo-less render.
func TestMemoTrickyTemplates(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for name, src := range trickyTemplates {
		tmpl := mustCompile(t, src)
		memo := newTestMemo(t, 1<<20)
		for c := 0; c < 6; c++ {
			msgs := randomConversation(rng, 10, c%2 == 0)
			msgs = append(msgs, map[string]any{"role": "user", "content": "stop"})
			for n := 1; n <= len(msgs); n++ {
				raw, _ := json.Marshal(msgs[:n])
				in := &Input{Messages: raw, BOSToken: "<s>", EOSToken: fmt.Sprint(n % 2), Now: fixedNow, AddGenerationPrompt: n%3 == 0}
				if n%2 == 0 {
					in.Kwargs = []byte(`{"x": "kw", "extra": "E", "enable_thinking": true}`)
					in.Tools = memoTestTools
				}
				want, werr := tmpl.Render(nil, in)
				in.Memo = memo
				for pass := 0; pass < 2; pass++ {
					got, gerr := tmpl.Render(nil, in)
					if (werr == nil) != (gerr == nil) || string(got) != string(want) {
						t.Fatalf("%s conv %d turn %d pass %d: memo render %q (%v), want %q (%v)", name, c, n, pass, got, gerr, want, werr)
					}
				}
			}
		}
	}
}

// BenchmarkRenderFollowup renders turn n+1 of the ~4,000-token conversation through a
// memo that saw turn n (the last user message changes every iteration); "off" renders the
// same without a memo.
// Run: go test -run '^$' -bench RenderFollowup -benchmem ./tokenize/chat
func BenchmarkRenderFollowup(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3_1", "deepseek_v3"} {
		for _, on := range []bool{true, false} {
			name := model + "/memo"
			if !on {
				name = model + "/off"
			}
			b.Run(name, func(b *testing.B) {
				tmpl := mustCompile(b, loadChatTemplate(b, model))
				in := benchInputFor(model, benchConversation())
				msgs := in.Messages
				at := strings.LastIndex(string(msgs), "Thanks.")
				if on {
					in.Memo = newTestMemo(b, DefaultRenderMemoBytes)
				}
				var out []byte
				turn := func(n int) {
					for k := 6; k >= 0; k-- {
						msgs[at+k] = byte('0' + n%10)
						n /= 10
					}
					var err error
					if out, err = tmpl.Render(out[:0], &in); err != nil {
						b.Fatal(err)
					}
				}
				turn(0)
				b.ReportAllocs()
				n := 1
				for b.Loop() {
					turn(n)
					n++
				}
			})
		}
	}
}
