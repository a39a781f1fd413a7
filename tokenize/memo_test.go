package tokenize

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testfix"
)

// stagedNames is every tokenizer `make fetch` stages.
var stagedNames = append(slices.Clone(goldenNames), "llama3_1")

func newTestMemo(t testing.TB, maxBytes int64) *Memo {
	t.Helper()
	m, err := NewMemo(maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// memoEntryBytes walks the memo's ring from tail to head and sums the entries their slot still
// points to, to check its running count; it fails t if a slot points anywhere else.
func memoEntryBytes(t testing.TB, m *Memo) (n int64, entries int) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.low.Load() != m.tail || m.head < m.tail || m.head-m.tail > m.ringWords {
		t.Fatalf("ring: tail %d (published %d), head %d, %d words", m.tail, m.low.Load(), m.head, m.ringWords)
	}
	for pos := m.tail; pos < m.head; pos += memoEntryWords(m.word(pos + 1)) {
		if m.slots[m.word(pos+2)].Load()&memoPosMask == pos+1 {
			n += 8 * int64(memoEntryWords(m.word(pos+1)))
			entries++
		}
	}
	live := 0
	for i := range m.slots {
		if m.slots[i].Load() != 0 {
			live++
		}
	}
	if live != entries {
		t.Fatalf("%d slots hold an entry, the ring holds %d live ones", live, entries)
	}
	return n, entries
}

// specialTexts splices corpus documents around the tokenizer's added tokens (a few of them,
// with the whitespace that lstrip/rstrip/single_word look at), so that texts have many
// segments and segments recur between texts.
func specialTexts(tk *Tokenizer, docs []string, n int, rng *rand.Rand) []string {
	var specials []string
	for _, tok := range tk.rawTrie.tokens {
		specials = append(specials, tok.content)
	}
	out := make([]string, 0, n)
	for i := 0; i < n; i++ {
		var sb strings.Builder
		for k := rng.IntN(6); k >= 0; k-- {
			doc := docs[rng.IntN(len(docs))]
			if len(doc) > 2000 {
				doc = doc[:2000] // may cut a rune: invalid UTF-8 is part of the test
			}
			sb.WriteString(doc)
			sp := specials[rng.IntN(len(specials))]
			switch rng.IntN(4) {
			case 0:
				sp = " " + sp
			case 1:
				sp += "  \n"
			}
			sb.WriteString(sp)
		}
		out = append(out, sb.String())
	}
	return out
}

// TestMemoCorpusDifferential: over the corpus documents (the golden inputs) and spliced texts,
// every staged tokenizer gives the same IDs through a memo as without, cold and warm, with
// and without special tokens, and with a memo small enough to evict all along.
func TestMemoCorpusDifferential(t *testing.T) {
	docs := loadCorpus(t)
	for _, name := range stagedNames {
		t.Run(name, func(t *testing.T) {
			tk := loadNamed(t, name)
			if r := tk.MemoUnsupported(); r != "" {
				t.Fatalf("memo unsupported: %s", r)
			}
			rng := rand.New(rand.NewPCG(1, uint64(len(name))))
			spliced := specialTexts(tk, docs, 300, rng)
			var wants [][]uint32
			for i, s := range spliced {
				want, err := tk.Encode(nil, s, i%2 == 0)
				if err != nil {
					t.Fatal(err)
				}
				wants = append(wants, want)
			}
			// The documents: cold then warm through one memo (every third under the race
			// detector, which makes the whole corpus take minutes).
			step := 1
			if raceEnabled {
				step = 3
			}
			memo := newTestMemo(t, DefaultMemoBytes)
			var want, got []uint32
			for i := 0; i < len(docs); i += step {
				special := i%2 == 0
				var err error
				if want, err = tk.Encode(want, docs[i], special); err != nil {
					t.Fatal(err)
				}
				for pass := 0; pass < 2; pass++ {
					if got, err = tk.EncodeMemo(got, docs[i], special, memo); err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("doc %d pass %d: memo differs%s\n  text: %.200q", i, pass, firstDiff(got, want), docs[i])
					}
				}
			}
			for _, bound := range []int64{DefaultMemoBytes, 256 << 10} {
				if bound != DefaultMemoBytes {
					memo = newTestMemo(t, bound)
				}
				for pass := 0; pass < 2; pass++ {
					for i, s := range spliced {
						var err error
						if got, err = tk.EncodeMemo(got, s, i%2 == 0, memo); err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(got, wants[i]) {
							t.Fatalf("bound %d pass %d text %d: memo differs%s\n  text: %.200q", bound, pass, i, firstDiff(got, wants[i]), s)
						}
					}
				}
				st := memo.Stats()
				if st.Hits == 0 || st.Misses == 0 || st.Inserts == 0 {
					t.Errorf("bound %d: the memo was not exercised: %+v", bound, st)
				}
				if bound < DefaultMemoBytes && st.Evictions == 0 {
					t.Errorf("bound %d: nothing was evicted: %+v", bound, st)
				}
				if st.Bytes > st.MaxBytes {
					t.Errorf("bound %d: holds %d bytes", bound, st.Bytes)
				}
			}
		})
	}
}

// TestMemoChatGoldens: the chat goldens (Jinja2 + HF tokenizers, tools/gen-tok-chat.js) through
// EncodeChatMemo, twice with one memo: the second pass is served from it.
func TestMemoChatGoldens(t *testing.T) {
	var g struct {
		Models map[string]struct {
			FixedNow string `json:"fixed_now"`
			Cases    []struct {
				Name                string   `json:"name"`
				Messages            *string  `json:"messages"`
				Tools               *string  `json:"tools"`
				Kwargs              *string  `json:"kwargs"`
				AddGenerationPrompt bool     `json:"add_generation_prompt"`
				ContinueFinal       bool     `json:"continue_final_message"`
				IDs                 []uint32 `json:"ids"`
			} `json:"cases"`
		} `json:"models"`
	}
	if err := json.Unmarshal(readGz(t, filepath.Join(testfix.RepoRoot(t), "testdata", "tokenize", "chat.golden.json.gz")), &g); err != nil {
		t.Fatal(err)
	}
	memo := newTestMemo(t, DefaultMemoBytes) // shared by all models, as in the proxy
	for name, mg := range g.Models {
		t.Run(name, func(t *testing.T) {
			m, err := newModel(name, testfix.TokenizerDir(t, name), loadNamed(t, name))
			if err != nil {
				t.Fatal(err)
			}
			if m.now, err = time.ParseInLocation("2006-01-02T15:04:05", mg.FixedNow, time.Local); err != nil {
				t.Fatal(err)
			}
			before := memo.Stats().Hits
			var ids []uint32
			for pass := 0; pass < 2; pass++ {
				for _, c := range mg.Cases {
					ids, err = m.EncodeChatMemo(ids, &ChatInput{Messages: rawOrNil(c.Messages), Tools: rawOrNil(c.Tools),
						TemplateKwargs: rawOrNil(c.Kwargs), AddGenerationPrompt: c.AddGenerationPrompt, ContinueFinalMessage: c.ContinueFinal}, memo)
					if err != nil {
						t.Errorf("%s: %v", c.Name, err)
						continue
					}
					if !slices.Equal(ids, c.IDs) {
						t.Errorf("pass %d %s: memo IDs differ from Jinja2 + HF tokenizers%s", pass, c.Name, firstDiff(ids, c.IDs))
					}
				}
			}
			if memo.Stats().Hits == before {
				t.Error("the second pass took nothing from the memo")
			}
		})
	}
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// randomTurn is a message of corpus text: a random cut of a document, sometimes with edge
// whitespace or joined to another (cuts may split a rune: invalid UTF-8 reaches the template
// as the JSON decoder's U+FFFD).
func randomTurn(docs []string, rng *rand.Rand) string {
	doc := docs[rng.IntN(len(docs))]
	a := rng.IntN(len(doc) + 1)
	b := min(len(doc), a+rng.IntN(1500))
	s := doc[a:b]
	switch rng.IntN(5) {
	case 0:
		s = " " + s + "\n\n"
	case 1:
		d := docs[rng.IntN(len(docs))]
		s += " " + d[:min(200, len(d))]
	case 2:
		s = strings.TrimSpace(s)
	}
	return s
}

// TestMemoMultiTurn grows random conversations turn by turn and compares the memo with no memo
// at every turn, for every staged tokenizer: through the chat template where the model has
// one, else as completions prompts joined by the tokenizer's added tokens.
func TestMemoMultiTurn(t *testing.T) {
	docs := loadCorpus(t)
	memo := newTestMemo(t, 4<<20) // shared, small: conversations evict each other
	for _, name := range stagedNames {
		t.Run(name, func(t *testing.T) {
			m := loadModelNamed(t, name)
			rng := rand.New(rand.NewPCG(7, uint64(len(name))))
			var want, got []uint32
			hits := memo.Stats().Hits
			for conv := 0; conv < 12; conv++ {
				msgs := []chatMsg{}
				if rng.IntN(2) == 0 {
					msgs = append(msgs, chatMsg{"system", randomTurn(docs, rng)})
				}
				var prompt strings.Builder
				for turn := 0; turn < 10; turn++ {
					msgs = append(msgs, chatMsg{"user", randomTurn(docs, rng)})
					var err error
					if m.HasChatTemplate() {
						raw, _ := json.Marshal(msgs)
						in := &ChatInput{Messages: raw, AddGenerationPrompt: true}
						if want, err = m.EncodeChat(want, in); err != nil {
							t.Fatalf("conv %d turn %d: %v", conv, turn, err)
						}
						got, err = m.EncodeChatMemo(got, in, memo)
					} else {
						prompt.WriteString(msgs[len(msgs)-1].Content)
						prompt.WriteString(m.eos)
						if want, err = m.EncodePrompt(want, prompt.String()); err != nil {
							t.Fatal(err)
						}
						got, err = m.EncodePromptMemo(got, prompt.String(), memo)
					}
					if err != nil {
						t.Fatalf("conv %d turn %d: %v", conv, turn, err)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("conv %d turn %d: memo differs%s", conv, turn, firstDiff(got, want))
					}
					msgs = append(msgs, chatMsg{"assistant", randomTurn(docs, rng)})
					if !m.HasChatTemplate() {
						prompt.WriteString(msgs[len(msgs)-1].Content)
						prompt.WriteString(m.bos)
					}
				}
			}
			if memo.Stats().Hits == hits {
				t.Error("follow-up turns took nothing from the memo")
			}
		})
	}
	if st := memo.Stats(); st.Bytes > st.MaxBytes || st.Evictions == 0 {
		t.Errorf("4 MiB memo after the conversations: %+v", st)
	}
}

// TestMemoBoundUnderChurn: unique conversations stream through a small memo; it never holds
// more than its bound, its byte count equals what its slots hold, and it keeps working.
func TestMemoBoundUnderChurn(t *testing.T) {
	docs := loadCorpus(t)
	m := loadModelNamed(t, "qwen3")
	memo := newTestMemo(t, 512<<10)
	rng := rand.New(rand.NewPCG(3, 4))
	var ids []uint32
	for conv := 0; conv < 300; conv++ {
		msgs := []chatMsg{{"system", fmt.Sprintf("Session %d. %s", conv, randomTurn(docs, rng))}}
		for turn := 0; turn < 4; turn++ {
			msgs = append(msgs, chatMsg{"user", fmt.Sprintf("%d/%d %s", conv, turn, randomTurn(docs, rng))},
				chatMsg{"assistant", randomTurn(docs, rng)})
		}
		raw, _ := json.Marshal(msgs)
		var err error
		if ids, err = m.EncodeChatMemo(ids, &ChatInput{Messages: raw, AddGenerationPrompt: true}, memo); err != nil {
			t.Fatal(err)
		}
		st := memo.Stats()
		if st.Bytes > st.MaxBytes {
			t.Fatalf("conversation %d: memo holds %d bytes, bound %d", conv, st.Bytes, st.MaxBytes)
		}
	}
	st := memo.Stats()
	held, _ := memoEntryBytes(t, memo)
	if held != st.Live || st.Live > st.Bytes {
		t.Errorf("live byte count %d (of %d), the ring's live entries take %d", st.Live, st.Bytes, held)
	}
	pages := int64(0)
	for i := range memo.pages {
		if p := memo.pages[i].Load(); p != nil {
			pages += 8 * int64(len(p.w))
		}
	}
	if memo.tableBytes+pages != st.Bytes {
		t.Errorf("byte count %d, table and pages take %d", st.Bytes, memo.tableBytes+pages)
	}
	if st.Evictions == 0 || st.Bytes < st.MaxBytes/2 {
		t.Errorf("churn did not fill and evict the memo: %+v", st)
	}
}

// TestMemoKeyIsExact: with every segment forced into one set, a lookup is only served by an
// entry of the same tokenizer, start flag and bytes; equal length or a shared prefix is not
// enough.
func TestMemoKeyIsExact(t *testing.T) {
	memo := newTestMemo(t, MinMemoBytes)
	memo.sets = 1 // every hash collides
	qwen, llama2 := loadNamed(t, "qwen3"), loadNamed(t, "llama2")
	a := strings.Repeat("alpha beta gamma ", 4)
	b := strings.Repeat("alpha beta gamma ", 3) + "alpha beta gamme "
	memo.put(qwen, a, true, []uint32{1, 2, 3})
	for _, c := range []struct {
		tk    *Tokenizer
		seg   string
		first bool
	}{{qwen, b, true}, {qwen, a, false}, {llama2, a, true}, {qwen, a[:len(a)-1], true}} {
		if ids, ok := memo.get(nil, c.tk, c.seg, c.first); ok {
			t.Errorf("%q first=%v served %v from another key", c.seg, c.first, ids)
		}
	}
	if ids, ok := memo.get(nil, qwen, a, true); !ok || !slices.Equal(ids, []uint32{1, 2, 3}) {
		t.Errorf("exact key: got %v, %v", ids, ok)
	}
	// Real encodings through the one-set memo still equal no memo.
	docs := loadCorpus(t)
	for _, tk := range []*Tokenizer{qwen, llama2} {
		for i, s := range specialTexts(tk, docs, 60, rand.New(rand.NewPCG(5, 6))) {
			want, _ := tk.Encode(nil, s, false)
			got, _ := tk.EncodeMemo(nil, s, false, memo)
			if !slices.Equal(got, want) {
				t.Fatalf("text %d: one-set memo differs%s", i, firstDiff(got, want))
			}
		}
	}
}

// TestMemoUnsupported: a tokenizer without added tokens says why and leaves the memo alone.
func TestMemoUnsupported(t *testing.T) {
	tk, err := parseTokenizer([]byte(strings.Replace(tinyTokenizer("null", "null", "null", ""),
		`[{"id":3,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}]`, "[]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if tk.MemoUnsupported() == "" {
		t.Fatal("no reason given for a tokenizer whose text is one segment")
	}
	memo := newTestMemo(t, MinMemoBytes)
	text := strings.Repeat("ab", 100)
	want, _ := tk.Encode(nil, text, false)
	got, _ := tk.EncodeMemo(nil, text, false, memo)
	if !slices.Equal(got, want) {
		t.Fatal("memo changed the IDs")
	}
	if st := memo.Stats(); st.Hits+st.Misses+st.Inserts != 0 {
		t.Errorf("memo used: %+v", st)
	}
	if r := loadNamed(t, "qwen3").MemoUnsupported(); r != "" {
		t.Errorf("qwen3: %s", r)
	}
	if _, err := NewMemo(MinMemoBytes - 1); err == nil || !strings.Contains(err.Error(), "at least") {
		t.Errorf("a bound under MinMemoBytes: %v", err)
	}
}

// TestMemoHitZeroAlloc: a follow-up served from a warm memo allocates nothing.
func TestMemoHitZeroAlloc(t *testing.T) {
	m := loadModelNamed(t, "qwen3")
	in := chatPrompt4k(t, m)
	memo := newTestMemo(t, DefaultMemoBytes)
	ids, _ := m.EncodeChatMemo(nil, in, memo)
	allocs := steadyAllocs(20, func() { ids, _ = m.EncodeChatMemo(ids, in, memo) })
	limit := 0.0
	if raceEnabled {
		limit = 64 // sync.Pool drops scratch at random: a dropped one regrows its buffers
	}
	if allocs > limit {
		t.Errorf("EncodeChatMemo on a warm memo allocates %.1f times per call (limit %v)", allocs, limit)
	}
	if st := memo.Stats(); st.Hits == 0 {
		t.Errorf("no hits: %+v", st)
	}
}

// TestMemoConcurrent: goroutines encode overlapping conversations through one small memo (so
// inserts, sweeps and lookups race); every result equals the memo-less one.
func TestMemoConcurrent(t *testing.T) {
	docs := loadCorpus(t)
	m := loadModelNamed(t, "qwen3")
	memo := newTestMemo(t, 1<<20)
	rng := rand.New(rand.NewPCG(9, 9))
	var inputs []*ChatInput
	var wants [][]uint32
	msgs := []chatMsg{{"system", randomTurn(docs, rng)}}
	for i := 0; i < 24; i++ {
		msgs = append(msgs, chatMsg{"user", randomTurn(docs, rng)})
		raw, _ := json.Marshal(msgs)
		in := &ChatInput{Messages: raw, AddGenerationPrompt: true}
		want, err := m.EncodeChat(nil, in)
		if err != nil {
			t.Fatal(err)
		}
		inputs, wants = append(inputs, in), append(wants, want)
		msgs = append(msgs, chatMsg{"assistant", randomTurn(docs, rng)})
	}
	// Then again with a small render memo beside it: iterations replay, their token notes
	// are set and read concurrently, and entries with their notes are evicted meanwhile.
	for _, render := range []*RenderMemo{nil, newTestRenderMemo(t, 256<<10)} {
		var wg sync.WaitGroup
		errs := make(chan string, 8)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				var ids []uint32
				for k := 0; k < 3*len(inputs); k++ {
					i := (k*7 + g*5) % len(inputs)
					in := *inputs[i]
					in.RenderMemo = render
					ids, _ = m.EncodeChatMemo(ids, &in, memo)
					if !slices.Equal(ids, wants[i]) {
						errs <- fmt.Sprintf("goroutine %d input %d (render memo %v): memos differ%s", g, i, render != nil, firstDiff(ids, wants[i]))
						return
					}
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		if st := memo.Stats(); st.Bytes > st.MaxBytes || st.Hits == 0 || render != nil && st.Notes == 0 {
			t.Errorf("after the race (render memo %v): %+v", render != nil, st)
		}
	}
}

// FuzzMemo: any text, split at any added tokens, encodes through a memo (tiny, one set, so
// entries collide and evict) as without one, cold and warm.
func FuzzMemo(f *testing.F) {
	for _, s := range []string{"Hello world, this is a segment long enough to keep", "<|im_start|>user\nhi there, how are you doing today?<|im_end|>",
		"<s> </s> a segment that is long enough to be memoized ok", "  \n\n\t x<|endoftext|>  \n\n\t x <|endoftext|>", "\xff\xfe long invalid utf-8 segment of text here"} {
		f.Add(s, uint8(3))
	}
	names := []string{"qwen3", "llama2"}
	toks := make([]*Tokenizer, len(names))
	for i, n := range names {
		toks[i] = loadNamed(f, n)
	}
	memo, err := NewMemo(MinMemoBytes)
	if err != nil {
		f.Fatal(err)
	}
	memo.sets = 1
	f.Fuzz(func(t *testing.T, s string, sep uint8) {
		for _, tk := range toks {
			sp := tk.rawTrie.tokens[int(sep)%len(tk.rawTrie.tokens)].content
			text := s + sp + s + " " + sp + s
			want, err := tk.Encode(nil, text, sep%2 == 0)
			if err != nil {
				t.Fatal(err)
			}
			for pass := 0; pass < 2; pass++ {
				got, err := tk.EncodeMemo(nil, text, sep%2 == 0, memo)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("pass %d: memo differs for %q%s", pass, text, firstDiff(got, want))
				}
			}
		}
		if st := memo.Stats(); st.Bytes > st.MaxBytes {
			t.Fatalf("memo holds %d bytes, bound %d", st.Bytes, st.MaxBytes)
		}
	})
}

// TestMemoBytesMatchHeap: what a full memo reports holding is what the heap holds for it
// (within the allocator's slack), so the bound is a real memory bound.
func TestMemoBytesMatchHeap(t *testing.T) {
	tk := loadNamed(t, "qwen3")
	rng := rand.New(rand.NewPCG(11, 12))
	var ms runtime.MemStats
	// Twice: the first GC only moves earlier tests' sync.Pool contents to the victim
	// cache, which the second frees; counted in before, they would shrink the growth.
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	memo := newTestMemo(t, 8<<20)
	ids := make([]uint32, 4096)
	text := make([]byte, 16384)
	for i := 0; memo.Stats().Evictions < 2000; i++ {
		n := 32 + rng.IntN(8000)
		for k := range text[:n] {
			text[k] = byte('a' + rng.IntN(26))
		}
		memo.put(tk, string(text[:n]), i%2 == 0, ids[:n/4])
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap := int64(ms.HeapAlloc) - int64(before)
	st := memo.Stats()
	if st.Bytes > st.MaxBytes {
		t.Fatalf("memo reports %d bytes, bound %d", st.Bytes, st.MaxBytes)
	}
	if heap > st.Bytes+256<<10 || heap < st.Bytes*7/10 {
		t.Errorf("memo reports %d bytes, the heap grew by %d", st.Bytes, heap)
	}
	t.Logf("memo reports %d bytes (bound %d), the heap grew by %d", st.Bytes, st.MaxBytes, heap)
	runtime.KeepAlive(memo)
}

// memoSegments returns n distinct segments of 200 to 1200 bytes and IDs of a quarter of
// their length (put stores whatever it is given).
func memoSegments(n int, rng *rand.Rand) ([]string, []uint32) {
	segs := make([]string, n)
	for i := range segs {
		b := make([]byte, 200+rng.IntN(1000))
		for k := range b {
			b[k] = byte('a' + rng.IntN(26))
		}
		copy(b, fmt.Sprintf("%d ", i))
		segs[i] = string(b)
	}
	ids := make([]uint32, 300)
	for i := range ids {
		ids[i] = rng.Uint32()
	}
	return segs, ids
}

// TestMemoInsertZeroAlloc: in steady state (the memo at its bound, every insert evicting,
// hits moving entries past the tail) an insert allocates nothing.
func TestMemoInsertZeroAlloc(t *testing.T) {
	tk := loadNamed(t, "qwen3")
	memo := newTestMemo(t, 256<<10)
	segs, ids := memoSegments(1000, rand.New(rand.NewPCG(13, 14)))
	dst := make([]uint32, 0, len(ids))
	i := 0
	insert := func() {
		seg := segs[i%len(segs)]
		memo.put(tk, seg, i%2 == 0, ids[:len(seg)/4])
		if prev := segs[(i+len(segs)-3)%len(segs)]; i%3 == 0 { // a hit sets a referenced bit
			dst, _ = memo.get(dst[:0], tk, prev, (i-3)%2 == 0)
		}
		i++
	}
	for range 2 * len(segs) { // fill the ring (allocating its pages) and turn it over
		insert()
	}
	before := memo.Stats()
	if before.Bytes < before.MaxBytes*9/10 || before.Evictions == 0 || before.Live < before.MaxBytes/2 {
		t.Fatalf("memo not at its bound: %+v", before)
	}
	if allocs := steadyAllocs(200, insert); allocs != 0 {
		t.Errorf("an insert into a full memo allocates %.2f times", allocs)
	}
	after := memo.Stats()
	if after.Inserts-before.Inserts < 200 || after.Evictions-before.Evictions < 100 || after.Bytes != before.Bytes {
		t.Errorf("the measured inserts did not insert and evict: before %+v, after %+v", before, after)
	}
	if got, ok := memo.get(nil, tk, segs[(i-1)%len(segs)], (i-1)%2 == 0); !ok || !slices.Equal(got, ids[:len(segs[(i-1)%len(segs)])/4]) {
		t.Errorf("the last insert: got %v, %v", len(got), ok)
	}
	memoEntryBytes(t, memo)
}

// TestMemoClockKeepsHot: a segment hit between inserts survives a stream of cold inserts many
// times the bound (the tail moves it instead of dropping it), while a cold one goes. FIFO
// would lose the hot one once per turn of the ring (about 20 times here).
func TestMemoClockKeepsHot(t *testing.T) {
	tk := loadNamed(t, "qwen3")
	memo := newTestMemo(t, 256<<10)
	segs, ids := memoSegments(4001, rand.New(rand.NewPCG(15, 16)))
	hot, cold := segs[0], segs[1]
	hotIDs := ids[:len(hot)/4]
	memo.put(tk, hot, true, hotIDs)
	memo.put(tk, cold, true, ids[:len(cold)/4])
	misses := 0
	var dst []uint32
	for _, seg := range segs[2:] {
		memo.put(tk, seg, true, ids[:len(seg)/4])
		var ok bool
		if dst, ok = memo.get(dst[:0], tk, hot, true); !ok {
			misses++
			memo.put(tk, hot, true, hotIDs)
		} else if !slices.Equal(dst, hotIDs) {
			t.Fatalf("hot segment served %d wrong IDs", len(dst))
		}
	}
	st := memo.Stats()
	if _, ok := memo.get(nil, tk, cold, true); ok {
		t.Error("a cold segment survived 4000 inserts")
	}
	if misses > 2 || st.Evictions < 3000 {
		t.Errorf("the hot segment was dropped %d times in %d inserts: %+v", misses, len(segs)-2, st)
	}
	memoEntryBytes(t, memo)
}

// BenchmarkMemoHit: a lookup served from the memo (a 4 KiB segment of 1000 IDs, a follow-up
// turn's earlier message).
func BenchmarkMemoHit(b *testing.B) {
	tk := loadNamed(b, "qwen3")
	memo := newTestMemo(b, DefaultMemoBytes)
	seg := strings.Repeat("abcdefghijklmnopqrstuvwxyz012345", 128)
	ids := make([]uint32, 1000)
	for i := range ids {
		ids[i] = uint32(i * 7)
	}
	memo.put(tk, seg, false, ids)
	dst := make([]uint32, 0, len(ids))
	b.ReportAllocs()
	b.SetBytes(int64(len(seg)))
	for i := 0; i < b.N; i++ {
		var ok bool
		if dst, ok = memo.get(dst[:0], tk, seg, false); !ok {
			b.Fatal("miss")
		}
	}
}

// BenchmarkMemoInsert: inserts into a full memo (each evicts; every third one is hit later).
func BenchmarkMemoInsert(b *testing.B) {
	tk := loadNamed(b, "qwen3")
	memo := newTestMemo(b, 1<<20)
	segs, ids := memoSegments(2000, rand.New(rand.NewPCG(17, 18)))
	var dst []uint32
	insert := func(i int) {
		seg := segs[i%len(segs)]
		memo.put(tk, seg, true, ids[:len(seg)/4])
		if i%3 == 0 {
			dst, _ = memo.get(dst[:0], tk, segs[(i+len(segs)-3)%len(segs)], true)
		}
	}
	for i := range 2 * len(segs) {
		insert(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		insert(i)
	}
}
