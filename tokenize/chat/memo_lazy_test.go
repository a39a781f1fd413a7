package chat

import (
	"encoding/json"
	"testing"
)

// Lazy sets (memo.go, memo_scan.go totalInt): a set of a total int expression in a memoized
// loop is recorded only when the iteration reads the name.

// lazyTemplates each bind a lazy name whose value changes from turn to turn (it follows
// messages|length) and read it, or not, in one of the ways a body can. They join
// trickyTemplates in TestMemoTrickyTemplates; the ones here also run growing
// conversations in TestMemoLazySets.
var lazyTemplates = map[string]string{
	// The name is read after a namespace write (the write's value comes from the name).
	"lazy-after-ns-write": `{% set ns = namespace(k=0) %}{% for m in messages %}{% set i = messages|length - loop.index0 %}{% set ns.k = ns.k + 1 %}{% if m.role == "user" %}{% set ns.k = i %}{% endif %}{{ ns.k if m.role == "tool" }}{% endfor %}{{ ns.k }}`,
	// Not total (reads a namespace): recorded eagerly, though a later write changes its input.
	"eager-ns-input":  `{% set ns = namespace(k=0) %}{% for m in messages %}{% set i = loop.index0 + ns.k %}{% set ns.k = ns.k + 1 %}{% if m.role == "user" %}{{ i }}{% endif %}{% endfor %}`,
	"lazy-read-twice": `{% for m in messages %}{% set i = (messages|length - 1) - loop.index0 %}{% if m.role == "user" %}{{ i }},{{ i + 1 }};{% endif %}{% endfor %}`,
	// An inner binding of the same name hides the lazy one; only the inner one is read.
	"lazy-shadowed": `{% for m in messages %}{% set i = messages|length - loop.index0 %}{% for i in [m.role] %}{{ i }}{% endfor %}{% set y %}{% set i = "z" %}{{ i }}{% endset %}{{ y }}{% endfor %}`,
	// Read inside a set block, a nested loop and its filter.
	"lazy-nested": `{% for m in messages %}{% set i = messages|length - loop.index0 %}{% set y %}{% if m.role == "tool" %}{{ i }}{% endif %}{% endset %}{{ y }}{% for c in (m.tool_calls or []) if i > 2 %}{{ c.function.name }}{% endfor %}{% endfor %}`,
	// Qwen3's pre-scan: the name is read in one iteration at most.
	"lazy-never-read": `{% set ns = namespace(multi=true, last=messages|length - 1) %}{% for m in messages[::-1] %}{% set index = (messages|length - 1) - loop.index0 %}{% if ns.multi and m.role == "user" and not m.content.startswith("<tool_response>") %}{% set ns.multi = false %}{% set ns.last = index %}{% endif %}{% endfor %}{{ ns.last }}`,
	// Set again (and from itself) before the read.
	"lazy-reset": `{% for m in messages %}{% set i = messages|length - loop.index0 %}{% if m.role == "user" %}{% set i = i + 1 %}{% endif %}{% if m.role == "assistant" %}{% set i = 7 %}{% endif %}{{ i if m.role != "tool" }}{% endfor %}`,
	// Not total: from the fifth message on its evaluation fails, which a replay that left it
	// out would not see.
	"eager-may-fail": `{% set ns = namespace(k=0 if messages|length < 5 else "s") %}{% for m in messages %}{% if m.role != "user" %}{% set j = ns.k + 1 %}{% endif %}{{ m.role }}{% endfor %}`,
	// The template rebinds messages: messages|length is no longer known to be total (from
	// the fifth message on it fails).
	"lazy-messages-rebound": `{% set msgs = messages %}{% set messages = 3 if msgs|length >= 5 else msgs %}{% for m in msgs %}{% if m.role != "user" %}{% set i = messages|length - loop.index0 %}{% endif %}{{ m.role }}{% endfor %}`,
}

func init() {
	for k, v := range lazyTemplates {
		trickyTemplates[k] = v
	}
}

// lazyMarked lists the lazy sets' expressions of t.
func lazyMarked(body []*stmt, out map[*expr]bool) {
	for _, s := range body {
		if s.lazy {
			out[s.e] = true
		}
		for _, b := range s.bodies {
			lazyMarked(b, out)
		}
		lazyMarked(s.body, out)
		lazyMarked(s.els, out)
	}
}

func TestMemoLazyMarks(t *testing.T) {
	for name, want := range map[string]int{"lazy-read-twice": 1, "lazy-never-read": 1, "eager-ns-input": 0, "lazy-messages-rebound": 0, "lazy-reset": 1, "eager-may-fail": 0} {
		got := map[*expr]bool{}
		lazyMarked(mustCompile(t, lazyTemplates[name]).body, got)
		if len(got) != want {
			t.Errorf("%s: %d lazy sets, want %d", name, len(got), want)
		}
	}
}

// TestMemoLazySets renders growing conversations with each lazy template through a memo
// against the memo-less render; the pre-scan's output-less iterations must replay; and,
// to show the test sees a read a record drops, the same runs with the lazy sets' reads
// stripped from the stored records must differ for a template that reads the name.
func TestMemoLazySets(t *testing.T) {
	var conv []map[string]any
	for i := range 12 {
		role := []string{"user", "assistant", "tool", "assistant"}[i%4]
		conv = append(conv, map[string]any{"role": role, "content": string(rune('a' + i))})
	}
	run := func(name string, strip bool) (diffs, replayed int) {
		tmpl := mustCompile(t, lazyTemplates[name])
		lazy := map[*expr]bool{}
		lazyMarked(tmpl.body, lazy)
		memo := newTestMemo(t, 1<<20)
		for n := 1; n <= len(conv); n++ {
			raw, _ := json.Marshal(conv[:n])
			want, werr := tmpl.Render(nil, &Input{Messages: raw})
			var use MemoUse
			got, gerr := tmpl.Render(nil, &Input{Messages: raw, Memo: memo, MemoUse: &use})
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("%s turn %d: memo render error %v, want %v", name, n, gerr, werr)
			}
			if string(got) != string(want) {
				diffs++
			}
			replayed += use.Replayed
			if strip {
				stripExprs(memo, lazy)
			}
		}
		return diffs, replayed
	}
	for name := range lazyTemplates {
		if d, _ := run(name, false); d != 0 {
			t.Errorf("%s: %d follow-up renders differ from the memo-less ones", name, d)
		}
	}
	if _, rep := run("lazy-never-read", false); rep < 20 {
		t.Errorf("lazy-never-read: %d iterations replayed over the conversation, want the pre-scan's", rep)
	}
	if d, _ := run("lazy-read-twice", true); d == 0 {
		t.Error("with the lazy sets' reads stripped the replays still matched: the test cannot see a dropped read")
	}
}

// stripExprs deletes the recorded reads of the given expressions (test only).
func stripExprs(m *RenderMemo, drop map[*expr]bool) {
	for i := range m.slots {
		if e := m.slots[i].Load(); e != nil && e.loop != nil {
			kept := e.ev[:0]
			for _, x := range e.ev {
				if x.e == nil || !drop[x.e] {
					kept = append(kept, x)
				}
			}
			e.ev = kept
		}
	}
}
