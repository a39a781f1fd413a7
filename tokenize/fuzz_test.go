package tokenize

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzEncode: any input encodes without panicking, to valid IDs, the same way twice; and for the
// SentencePiece-style model, cutting long words at '▁' runs gives what merging the whole word
// gives (the exactness claim of encodeChunks).
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"Hello world", "  \n\n\t x", "<|im_start|>user\nhi<|im_end|>", "<s> </s>", "日本語 テキスト",
		"a\u0301\u0302", "it's 'S", "\xff\xfe", strings.Repeat("ab ", 40), "▁▁x▁y"} {
		f.Add(s)
	}
	names := []string{"qwen3", "gpt4o", "llama2"}
	toks := make([]*Tokenizer, len(names))
	limits := make([]uint32, len(names))
	for i, n := range names {
		toks[i] = loadNamed(f, n)
		limits[i] = uint32(toks[i].model.vocabSize)
		for _, id := range toks[i].addedByContent {
			limits[i] = max(limits[i], id+1)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		for i, tk := range toks {
			a, err := tk.Encode(nil, s, true)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range a {
				if id >= limits[i] {
					t.Fatalf("%s: id %d out of range for %q", names[i], id, s)
				}
			}
			b, _ := tk.Encode(nil, s, true)
			if !slices.Equal(a, b) {
				t.Fatalf("%s: two encodings of %q differ", names[i], s)
			}
		}
		if !utf8.ValidString(s) {
			return
		}
		tk := toks[2]
		w := strings.ReplaceAll(s, " ", "▁")
		var st encodeState
		whole := tk.model.encodeWord(nil, w, &st.bpe)
		chunked := tk.encodeChunks(nil, &st, w)
		if !slices.Equal(whole, chunked) {
			t.Fatalf("llama2: chunked %v != whole %v for %q", chunked, whole, w)
		}
	})
}

// TestChunksMatchWholeWord: for both SentencePiece-style models, encodeChunks equals merging the
// whole word, on corpus text and on text around Gemma's '>▁</' token (a cut there is unsafe).
func TestChunksMatchWholeWord(t *testing.T) {
	docs := loadCorpus(t)
	for _, name := range []string{"llama2", "gemma3"} {
		tk := loadNamed(t, name)
		if !tk.model.metaChunks {
			t.Fatalf("%s: chunking is off", name)
		}
		if name == "gemma3" && !tk.model.metaUnsafeBefore("x>") {
			t.Fatal("gemma3: '>' (token '>▁</') is not marked unsafe")
		}
		var st encodeState
		inputs := []string{"<b>▁</b>", "a>▁</td>▁x", ">▁▁</", "x▁>▁</▁y", "▁▁▁", "a▁"}
		for i := 0; i < len(docs); i += 13 {
			inputs = append(inputs, strings.ReplaceAll(docs[i], " ", "▁"))
		}
		for _, w := range inputs {
			whole := tk.model.encodeWord(nil, w, &st.bpe)
			chunked := tk.encodeChunks(nil, &st, w)
			if !slices.Equal(whole, chunked) {
				t.Fatalf("%s: chunked encoding differs for %.80q", name, w)
			}
		}
	}
}
