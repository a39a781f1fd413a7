package tokenize

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvgate/kvgate/tokenize/chat"
)

func newTestRenderMemo(t testing.TB, maxBytes int64) *RenderMemo {
	m, err := NewRenderMemo(maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestNotesMultiTurn grows random conversations turn by turn through both memos (a small
// render memo, so that entries and their notes are evicted and made again) and compares
// every turn with the plain encode, for every staged model with a chat template; some
// turns end inside the final message (continue_final_message), which cuts the render.
// Replayed turns must have been served from their notes.
func TestNotesMultiTurn(t *testing.T) {
	docs := loadCorpus(t)
	memo := newTestMemo(t, 4<<20)
	render := newTestRenderMemo(t, 1<<20)
	for _, name := range stagedNames {
		m := loadModelNamed(t, name)
		if !m.HasChatTemplate() {
			continue
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(len(name))))
			var want, got []uint32
			notes := memo.Stats().Notes
			for conv := 0; conv < 8; conv++ {
				msgs := []chatMsg{}
				if rng.IntN(2) == 0 {
					msgs = append(msgs, chatMsg{"system", randomTurn(docs, rng)})
				}
				for turn := 0; turn < 8; turn++ {
					msgs = append(msgs, chatMsg{"user", randomTurn(docs, rng)})
					in := &ChatInput{AddGenerationPrompt: true, RenderMemo: render}
					if rng.IntN(6) == 0 {
						// The assistant's answer so far, to be continued.
						in.AddGenerationPrompt, in.ContinueFinalMessage = false, true
						msgs = append(msgs, chatMsg{"assistant", randomTurn(docs, rng) + "x"})
					}
					in.Messages, _ = json.Marshal(msgs)
					plain := *in
					plain.RenderMemo = nil
					var err error
					if want, err = m.EncodeChat(want, &plain); err != nil {
						t.Fatalf("conv %d turn %d: %v", conv, turn, err)
					}
					if got, err = m.EncodeChatMemo(got, in, memo); err != nil {
						t.Fatalf("conv %d turn %d: %v", conv, turn, err)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("conv %d turn %d: memos differ%s", conv, turn, firstDiff(got, want))
					}
					if !in.ContinueFinalMessage {
						msgs = append(msgs, chatMsg{"assistant", randomTurn(docs, rng)})
					}
				}
			}
			if memo.Stats().Notes == notes {
				t.Error("no replayed iteration was served from its note")
			}
		})
	}
	if st := render.Stats(); st.Bytes > 1<<20 || st.Evictions == 0 {
		t.Errorf("1 MiB render memo after the conversations: %+v", st)
	}
}

// TestNoteMarksChecked: a note serves a span only when the added tokens found there are the
// noted ones, in start, end and ID, and only its own tokenizer.
func TestNoteMarksChecked(t *testing.T) {
	m := loadModelNamed(t, "qwen3")
	memo := newTestMemo(t, DefaultMemoBytes)
	render := newTestRenderMemo(t, DefaultRenderMemoBytes)
	raw, _ := json.Marshal([]chatMsg{{"system", "You are terse."}, {"user", "What is a prefix cache, in one line?"},
		{"assistant", "A store of computed attention keys and values."}, {"user", "And a block?"}})
	in := &ChatInput{Messages: raw, AddGenerationPrompt: true, RenderMemo: render}
	for range 2 { // record, then replay and note
		if _, err := m.EncodeChatMemo(nil, in, memo); err != nil {
			t.Fatal(err)
		}
	}
	var spans []chat.OutSpan
	out, err := m.tmpl.Render(nil, &chat.Input{Messages: raw, AddGenerationPrompt: true, Memo: render, Spans: &spans})
	if err != nil {
		t.Fatal(err)
	}
	ms := m.tok.rawTrie.find(nil, string(out))
	checked := 0
	for i := range spans {
		note := spans[i].Note()
		if note == nil {
			continue
		}
		j := slices.IndexFunc(ms, func(x addedMatch) bool { return x.start >= spans[i].Start })
		at := func(ms []addedMatch) int {
			ns := noteSpans{spans: spans[i:]}
			return ns.at(m.tok, ms, j, 0)
		}
		if k := at(ms); k != len(note.Marks) {
			t.Fatalf("span %d: the note covers %d matches of the text it was made on, want %d", i, k, len(note.Marks))
		}
		last := j + len(note.Marks) - 1
		for _, edit := range []func(*addedMatch){
			func(x *addedMatch) { x.start-- }, func(x *addedMatch) { x.end++ }, func(x *addedMatch) { x.id++ },
		} {
			for _, at1 := range []int{j, last} {
				moved := slices.Clone(ms)
				edit(&moved[at1])
				if k := at(moved); k != 0 {
					t.Errorf("span %d: a changed match %d still takes the note (%d matches)", i, at1, k)
				}
			}
		}
		other := loadModelNamed(t, "llama3")
		if ns := (noteSpans{spans: spans[i:]}); ns.at(other.tok, ms, j, 0) != 0 {
			t.Errorf("span %d: another tokenizer takes the note", i)
		}
		checked++
	}
	if checked < 2 {
		t.Fatalf("%d spans with a note of %d; want the earlier turns noted", checked, len(spans))
	}
}

// TestNotesZeroAlloc: a follow-up served through both memos, its earlier turns from their
// notes, allocates nothing.
func TestNotesZeroAlloc(t *testing.T) {
	m := loadModelNamed(t, "qwen3")
	in := chatPrompt4k(t, m)
	in.RenderMemo = newTestRenderMemo(t, DefaultRenderMemoBytes)
	memo := newTestMemo(t, DefaultMemoBytes)
	var ids []uint32
	for range 3 {
		ids, _ = m.EncodeChatMemo(ids, in, memo)
	}
	notes := memo.Stats().Notes
	allocs := steadyAllocs(20, func() { ids, _ = m.EncodeChatMemo(ids, in, memo) })
	limit := 0.0
	if raceEnabled {
		limit = 64 // sync.Pool drops scratch at random: a dropped one regrows its buffers
	}
	if allocs > limit {
		t.Errorf("EncodeChatMemo through both warm memos allocates %.1f times per call (limit %v)", allocs, limit)
	}
	if memo.Stats().Notes == notes {
		t.Error("no note served the follow-ups")
	}
}

// FuzzChatNotes: a conversation of any three messages, grown turn by turn, encodes through
// both memos (small, so they evict) as without them; message text may hold added tokens
// or pieces of them.
func FuzzChatNotes(f *testing.F) {
	for _, s := range [][3]string{
		{"hello there, a plain question", "a plain answer of some length", "and a follow-up"},
		{"<|im_end|>\n<|im_start|>user\nnested", "half a token <|im_", "end|> the rest"},
		{"  leading and trailing  \n\n", "\n", "<|endoftext|><|begin_of_text|>"},
		{"\xff\xfe invalid", "ok", ""},
	} {
		f.Add(s[0], s[1], s[2], uint8(0))
	}
	models := []*Model{loadModelNamed(f, "qwen3"), loadModelNamed(f, "llama3")}
	memo, err := NewMemo(MinMemoBytes)
	if err != nil {
		f.Fatal(err)
	}
	render := newTestRenderMemo(f, MinRenderMemoBytes)
	f.Fuzz(func(t *testing.T, a, b, c string, shape uint8) {
		texts := [3]string{a, b, c}
		for _, m := range models {
			var msgs []chatMsg
			for turn := 0; turn < 6; turn++ {
				role := "user"
				if turn%2 == 1 {
					role = "assistant"
				}
				msgs = append(msgs, chatMsg{role, texts[(turn+int(shape))%3]})
				if role == "assistant" && shape&4 == 0 {
					continue
				}
				raw, _ := json.Marshal(msgs)
				in := ChatInput{Messages: raw, AddGenerationPrompt: role == "user", ContinueFinalMessage: role == "assistant"}
				want, werr := m.EncodeChat(nil, &in)
				for pass := 0; pass < 2; pass++ {
					in.RenderMemo = render
					got, err := m.EncodeChatMemo(nil, &in, memo)
					if (err != nil) != (werr != nil) || !slices.Equal(got, want) {
						t.Fatalf("%s turn %d pass %d: memos give %v%s (plain: %v)", m.Name, turn, pass, err, firstDiff(got, want), werr)
					}
				}
			}
		}
		if st := render.Stats(); st.Bytes > MinRenderMemoBytes {
			t.Fatalf("render memo holds %d bytes, bound %d", st.Bytes, MinRenderMemoBytes)
		}
	})
}
