package tokenize

import "github.com/kvgate/kvgate/tokenize/chat"

// Token notes on replayed iterations (chat.TokenNote): the IDs a rendered chat's earlier turns
// had, taken whole.
//
// A follow-up turn's render replays the earlier turns' loop iterations from the render memo,
// each writing the memo entry's output verbatim (chat.OutSpan). The first time a replayed
// iteration is encoded, appendEncode notes on its entry the added tokens it split the output
// on (positions relative to the output, and IDs) and the IDs from the first of them through
// the last. The next time, if the added tokens found in the whole text inside that span are
// exactly the noted ones, it appends the noted IDs instead of encoding the pieces between.
//
// Why that is exact: appendEncode emits, between two consecutive added-token matches, the IDs
// of the text between them, a function of the tokenizer, that text and whether it starts the
// input (Memo's argument); inside a span no piece starts the input (each follows a match).
// Equal matches at equal offsets in equal bytes (the span is the entry's output, verbatim)
// delimit equal pieces, so the IDs from the first match through the last are the noted ones.
// The matches themselves are still found on the whole text every time (lstrip, rstrip and
// single_word look past a span's ends), and compared in full (start, end, ID), so a context
// that moves, strips or drops any of them falls back to the ordinary path. A note names its
// tokenizer (memoSalt). Notes are used only with a Memo, so a router with the memos off
// encodes exactly as before.
type noteSpans struct {
	spans  []chat.OutSpan // the spans from the current match's on
	marks  []chat.NoteMark
	noting bool // the first span has no note: it is being encoded, to be noted
	first  int  // the match of its first mark
	from   int  // the IDs' length before that mark
}

// at is called at match j, when the IDs of the text before it are in dst[:n]. It returns
// how many matches, from j on, the first span's note covers (its IDs to be appended in place
// of their encoding), or 0.
func (ns *noteSpans) at(t *Tokenizer, ms []addedMatch, j, n int) int {
	for len(ns.spans) > 0 && ns.spans[0].Start+ns.spans[0].Len < ms[j].end {
		ns.spans, ns.noting = ns.spans[1:], false
	}
	if len(ns.spans) == 0 {
		return 0
	}
	sp := &ns.spans[0]
	if ms[j].start < sp.Start || j > 0 && ms[j-1].start >= sp.Start {
		return 0 // before the span, or not its first match
	}
	note := sp.Note()
	if note == nil {
		ns.noting, ns.first, ns.from = true, j, n
		return 0
	}
	k := len(note.Marks)
	if note.Owner != t.memoSalt || len(ms)-j < k {
		return 0
	}
	for i, mk := range note.Marks {
		m := ms[j+i]
		if m.start-sp.Start != int(mk.Start) || m.end-sp.Start != int(mk.End) || m.id != mk.ID {
			return 0
		}
	}
	return k
}

// noted is called while noting, after match j's ID was appended to dst: at the span's last
// match it sets the span's note, unless an encoding failed meanwhile.
func (ns *noteSpans) noted(t *Tokenizer, st *encodeState, ms []addedMatch, j int, dst []uint32) {
	sp := &ns.spans[0]
	end := sp.Start + sp.Len
	if st.err != nil {
		ns.noting = false
		return
	}
	if j+1 < len(ms) && ms[j+1].end <= end {
		return // the span goes on
	}
	ns.noting = false
	ns.marks = ns.marks[:0]
	for _, m := range ms[ns.first : j+1] {
		ns.marks = append(ns.marks, chat.NoteMark{Start: int32(m.start - sp.Start), End: int32(m.end - sp.Start), ID: m.id})
	}
	sp.SetNote(t.memoSalt, ns.marks, dst[ns.from:])
}
