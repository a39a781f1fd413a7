package tokenize

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const tinyModel = `{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,
"fuse_unk":false,"byte_fallback":false,"vocab":{"a":0,"b":1,"ab":2,"<s>":3},"merges":["a b"]}`

func tinyTokenizer(normalizer, pre, post, model string) string {
	if model == "" {
		model = tinyModel
	}
	return fmt.Sprintf(`{"version":"1.0","truncation":null,"padding":null,
"added_tokens":[{"id":3,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":%s,"pre_tokenizer":%s,"post_processor":%s,"decoder":null,"model":%s}`, normalizer, pre, post, model)
}

// TestUnknownComponentsFailClosed: a component the code does not implement fails the load with
// an error naming it; nothing is guessed.
func TestUnknownComponentsFailClosed(t *testing.T) {
	cases := []struct {
		json, want string
	}{
		{tinyTokenizer(`{"type":"BertNormalizer"}`, "null", "null", ""), `normalizer: unsupported normalizer type "BertNormalizer"`},
		{tinyTokenizer(`{"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Precompiled","precompiled_charsmap":"AA=="}]}`, "null", "null", ""), `"Precompiled"`},
		{tinyTokenizer("null", `{"type":"BertPreTokenizer"}`, "null", ""), `pre_tokenizer: unsupported pre-tokenizer type "BertPreTokenizer"`},
		{tinyTokenizer("null", `{"type":"Sequence","pretokenizers":[{"type":"Punctuation","behavior":"Isolated"}]}`, "null", ""), `"Punctuation"`},
		{tinyTokenizer("null", `{"type":"Split","pattern":{"Regex":"a"},"behavior":"Sideways","invert":false}`, "null", ""), `unknown split behavior "Sideways"`},
		{tinyTokenizer("null", `{"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated","invert":false}`, "null", ""), `split regex "(unclosed"`},
		{tinyTokenizer("null", `{"type":"Sequence","pretokenizers":[{"type":"ByteLevel","add_prefix_space":false,"use_regex":false},{"type":"Digits","individual_digits":true}]}`, "null", ""), "ByteLevel followed by another pre-tokenizer"},
		{tinyTokenizer("null", "null", `{"type":"Fancy"}`, ""), `post_processor: unsupported post-processor type "Fancy"`},
		{tinyTokenizer("null", "null", "null", `{"type":"WordPiece","vocab":{"a":0}}`), `unsupported model type "WordPiece"`},
		{tinyTokenizer("null", "null", "null", `{"type":"Unigram","vocab":[["a",0]]}`), `unsupported model type "Unigram"`},
		{tinyTokenizer("null", "null", "null", strings.Replace(tinyModel, `"dropout":null`, `"dropout":0.1`, 1)), "dropout"},
		{tinyTokenizer("null", "null", "null", strings.Replace(tinyModel, `["a b"]`, `["a c"]`, 1)), "not in the vocabulary"},
		{tinyTokenizer("null", "null", "null", strings.Replace(tinyModel, `"unk_token":null`, `"unk_token":"<unk>"`, 1)), `unk_token "<unk>"`},
		{`{"model": null}`, "model is missing"},
		{`not json`, "parse tokenizer.json"},
	}
	for _, c := range cases {
		_, err := parseTokenizer([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error containing %q, got %v", c.want, err)
		}
	}
	if _, err := LoadTokenizer("/nonexistent/tokenizer.json"); err == nil {
		t.Error("missing file accepted")
	}
}

func TestTinyTokenizer(t *testing.T) {
	tk, err := parseTokenizer([]byte(tinyTokenizer("null", "null",
		`{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"<s>","type_id":0}}],"pair":[],"special_tokens":{"<s>":{"id":"<s>","ids":[3],"tokens":["<s>"]}}}`, "")))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in      string
		special bool
		want    []uint32
	}{
		{"ab", false, []uint32{2}},
		{"aab", false, []uint32{0, 2}},
		{"ab<s>ba", false, []uint32{2, 3, 1, 0}},
		{"ab", true, []uint32{3, 2, 3}},
		{"", true, []uint32{3, 3}},
		{"", false, []uint32{}},
		{"xyz", false, []uint32{}},     // no unk token: unknown characters vanish, as in HF
		{"a\xffb", false, []uint32{2}}, // read as "a\uFFFDb"; U+FFFD is not in the vocabulary
		{"b\xff<s>", false, []uint32{1, 3}},
	} {
		got, err := tk.Encode(nil, c.in, c.special)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q, %v) = %v, %v; want %v", c.in, c.special, got, err, c.want)
		}
	}
}

// TestEncodeConcurrent: concurrent encoders share the word cache and scratch pool and get the
// same IDs as one encoder alone (run with -race).
func TestEncodeConcurrent(t *testing.T) {
	docs := loadCorpus(t)[:300]
	for _, name := range []string{"qwen3", "llama2"} {
		tk := loadNamed(t, name)
		want := make([][]uint32, len(docs))
		for i, d := range docs {
			want[i], _ = tk.Encode(nil, d, true)
		}
		tk.cache = newWordCache() // start cold so goroutines race to fill it
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				var ids []uint32
				for k := range docs {
					i := (k*7 + g*31) % len(docs)
					ids, _ = tk.Encode(ids, docs[i], true)
					if !slices.Equal(ids, want[i]) {
						t.Errorf("%s: goroutine %d doc %d differs", name, g, i)
						return
					}
				}
			}(g)
		}
		wg.Wait()
	}
}

// steadyAllocs is testing.AllocsPerRun, retried: a GC that lands inside the window empties the
// scratch pool (sync.Pool is cleared by GC), which is not steady state.
func steadyAllocs(runs int, f func()) float64 {
	best := testing.AllocsPerRun(runs, f)
	for try := 0; try < 3 && best > 0; try++ {
		best = min(best, testing.AllocsPerRun(runs, f))
	}
	return best
}

// TestEncodeZeroAlloc: in steady state Encode allocates nothing (pooled scratch, warm cache,
// caller's buffer). Under the race detector sync.Pool drops items at random, so a few
// allocations of fresh scratch are allowed there.
func TestEncodeZeroAlloc(t *testing.T) {
	text := strings.Repeat("The quick brown fox, it's 42 jumps over the lazy dog!\n\tfunc main() { return x+1 }  日本語のテキスト 😀 ", 40)
	for _, name := range goldenNames {
		tk := loadNamed(t, name)
		ids, _ := tk.Encode(nil, text, true)
		allocs := steadyAllocs(50, func() {
			ids, _ = tk.Encode(ids, text, true)
		})
		limit := 0.0
		if raceEnabled {
			limit = 8
		}
		if allocs > limit {
			t.Errorf("%s: Encode allocates %.1f times per call (limit %v)", name, allocs, limit)
		}
		// A ~4k-token completions prompt made of corpus documents (all the edge cases).
		m := loadModelNamed(t, name)
		prompt := completionPrompt4k(m, loadCorpus(t))
		ids, _ = m.EncodePrompt(ids, prompt)
		allocs = steadyAllocs(10, func() {
			ids, _ = m.EncodePrompt(ids, prompt)
		})
		if raceEnabled {
			limit = 64 // a dropped scratch regrows each of its buffers
		}
		if allocs > limit {
			t.Errorf("%s: EncodePrompt of a 4k-token prompt allocates %.1f times per call (limit %v)", name, allocs, limit)
		}
	}
}

// TestFallbackRegexTimeout: a fallback regex that backtracks catastrophically fails the encode
// with an error instead of hanging it.
func TestFallbackRegexTimeout(t *testing.T) {
	tk, err := parseTokenizer([]byte(tinyTokenizer("null", `{"type":"Split","pattern":{"Regex":"(a+)+b"},"behavior":"Isolated","invert":false}`, "null", "")))
	if err != nil {
		t.Fatal(err)
	}
	if tk.pre[0].pat.re == nil {
		t.Fatal("(a+)+b should use the fallback engine")
	}
	tk.pre[0].pat.re.MatchTimeout = 50 * time.Millisecond
	ids, err := tk.Encode(nil, "aab", false)
	if err != nil || !slices.Equal(ids, []uint32{0, 2}) {
		t.Fatalf("Encode(aab) = %v, %v", ids, err)
	}
	start := time.Now()
	_, err = tk.Encode(nil, strings.Repeat("a", 40)+"!", false)
	if err == nil || !strings.Contains(err.Error(), "(a+)+b") {
		t.Fatalf("want a timeout error naming the regex, got %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("the encode took %v", time.Since(start))
	}
	if _, err := tk.Encode(nil, strings.Repeat("x", MaxTextBytes+1), false); err == nil {
		t.Fatal("text over MaxTextBytes accepted")
	}
}

// TestSingleWordBoundaries pins which neighbours make a single_word added token part of a word,
// as probed from the HF library: letters, digits, '_', marks, letter numbers and ZWJ do; '-',
// space and '²' do not.
func TestSingleWordBoundaries(t *testing.T) {
	loadClasses()
	for _, c := range []struct {
		r    rune
		word bool
	}{{'a', true}, {'1', true}, {'_', true}, {'\u0301', true}, {'\u2167', true}, {'\u0903', true}, {'\u0660', true},
		{'\u00aa', true}, {'\u02b0', true}, {'\u200d', true}, {'\u3005', true}, {'\u16ee', true}, {'\u0345', true},
		{'-', false}, {' ', false}, {'\u00b2', false}} {
		if got := isWordChar(c.r); got != c.word {
			t.Errorf("isWordChar(%U) = %v, want %v", c.r, got, c.word)
		}
	}
}
