package tokenize

import (
	"slices"
	"strings"
	"testing"
)

// TestByteSegsMatchPlain: every one-byte ASCII segment encodes the same through byteSegs as
// through the full path, alone (first), after an added token (not first) and before one, for
// every staged tokenizer and a Metaspace one whose IDs depend on first, with and without a
// memo.
func TestByteSegsMatchPlain(t *testing.T) {
	for _, name := range stagedNames {
		t.Run(name, func(t *testing.T) {
			// The shared copy: no test of the package runs in parallel, and the table is
			// restored before this one returns.
			checkByteSegs(t, loadNamed(t, name))
		})
	}
	t.Run("metaspace_first", func(t *testing.T) {
		model := strings.Replace(tinyModel, `"<s>":3}`, `"<s>":3,"▁":4,"▁a":5,"\n":6}`, 1)
		model = strings.Replace(model, `["a b"]`, `["a b","▁ a"]`, 1)
		tk, err := parseTokenizer([]byte(tinyTokenizer("null",
			`{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true}`, "null", model)))
		if err != nil {
			t.Fatal(err)
		}
		first := tk.encodeSegment(nil, &encodeState{}, "a", true)
		later := tk.encodeSegment(nil, &encodeState{}, "a", false)
		if slices.Equal(first, later) {
			t.Fatalf("\"a\" is %v first and %v later: the case does not depend on first", first, later)
		}
		checkByteSegs(t, tk)
	})
}

func checkByteSegs(t *testing.T, tk *Tokenizer) {
	t.Helper()
	if tk.byteSegs.n['a'<<1] == byteSegNone || tk.byteSegs.n['a'<<1|1] == byteSegNone {
		t.Fatalf("\"a\" is not in byteSegs: the test would not reach it")
	}
	sp := tk.rawTrie.tokens[0].content
	var texts []string
	for c := range 128 {
		s := string(rune(c))
		texts = append(texts, s, sp+s, s+sp, sp+s+sp, sp+s+sp+s+s+sp+s)
	}
	encodeAll := func(memo *Memo) [][]uint32 {
		var out [][]uint32
		for i, s := range texts {
			ids, err := tk.EncodeMemo(nil, s, i%2 == 0, memo)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, ids)
		}
		return out
	}
	got, gotMemo := encodeAll(nil), encodeAll(newTestMemo(t, MinMemoBytes))
	saved := tk.byteSegs.n
	defer func() { tk.byteSegs.n = saved }()
	for i := range tk.byteSegs.n {
		tk.byteSegs.n[i] = byteSegNone
	}
	want := encodeAll(nil)
	tk.byteSegs.n = saved
	for i := range texts {
		if !slices.Equal(got[i], want[i]) || !slices.Equal(gotMemo[i], want[i]) {
			t.Fatalf("%q: byteSegs %v, memo %v, full path %v", texts[i], got[i], gotMemo[i], want[i])
		}
	}
}
