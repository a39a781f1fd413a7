package chat

// Token notes: what a tokenizer learned of a memoized iteration's output, kept with the
// iteration's memo entry, so that a follow-up turn, whose render replays the earlier turns'
// iterations verbatim, takes their token IDs with one compare and one copy per iteration
// instead of a tokenization memo lookup (hash, compare, copy) per piece of text.
//
// chat only keeps a note and counts its bytes against the memo's bound; what a note means,
// and why using it is exact, is the tokenizer's (tokenize.Tokenizer's appendEncode).

// NoteMark is an added token the tokenizer split the rendered text on: its bytes
// [Start, End) relative to the iteration's output, and its ID.
type NoteMark struct {
	Start, End int32
	ID         uint32
}

// TokenNote is a tokenizer's note on an iteration's output: the added tokens it found
// inside the output, in order (at least two), and the IDs of the text from the first one's
// start through the last one's end. Owner names the tokenizer. A note is immutable once
// set.
type TokenNote struct {
	Owner uint64
	Marks []NoteMark
	IDs   []uint32
}

// OutSpan is one replayed iteration in a render's output: out[Start:Start+Len] is the memo
// entry's output, verbatim (Input.Spans).
type OutSpan struct {
	Start, Len int
	entry      *memoEntry
	memo       *RenderMemo
}

// Note returns the span's note, nil when none was set.
func (s *OutSpan) Note() *TokenNote { return s.entry.note.Load() }

// SetNote keeps a copy of a note on the span's entry, when it has none and the memo still
// holds it. The copy is carved from the memo's current generation and counted against its
// bound like the entries (it may evict old entries).
func (s *OutSpan) SetNote(owner uint64, marks []NoteMark, ids []uint32) {
	m, e := s.memo, s.entry
	if e.note.Load() != nil || len(marks) < 2 || int64(len(ids))*4 > m.genBytes/4 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.note.Load() != nil || m.slots[e.slot].Load() != e {
		return // noted meanwhile, or evicted: a note would never be read
	}
	g := m.cur()
	e.note.Store(g.copyNote(&TokenNote{Owner: owner, Marks: marks, IDs: ids}))
	m.account()
	m.shrink(e)
}

// copyNote copies n into g's slabs.
func (g *memoGen) copyNote(n *TokenNote) *TokenNote {
	c := &genCarve(g, &g.notes, 1)[0]
	c.Owner = n.Owner
	c.Marks = genCarve(g, &g.marks, len(n.Marks))
	copy(c.Marks, n.Marks)
	c.IDs = genCarve(g, &g.ids, len(n.IDs))
	copy(c.IDs, n.IDs)
	return c
}
