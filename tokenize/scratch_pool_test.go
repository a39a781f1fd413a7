package tokenize

import (
	"strings"
	"testing"
	"unsafe"
)

// scratchBytes is the heap an encodeState's buffers hold (their capacities).
func scratchBytes(st *encodeState) int {
	n := cap(st.normBuf[0]) + cap(st.normBuf[1]) + cap(st.text) + cap(st.valid) + cap(st.bpe.str)
	n += (cap(st.matches) + cap(st.nmatches)) * int(unsafe.Sizeof(addedMatch{}))
	n += (cap(st.spans[0]) + cap(st.spans[1])) * int(unsafe.Sizeof(span{}))
	n += cap(st.bpe.syms)*int(unsafe.Sizeof(symbol{})) + cap(st.bpe.heap)*8
	n += cap(st.marks) * int(unsafe.Sizeof(st.marks[0]))
	return n
}

// TestScratchNotKeptAfterHugeEncode: one huge request (a 16 MiB text with invalid UTF-8 and
// many added tokens) must not leave its grown scratch in the pool, where steady load would
// keep it indefinitely.
func TestScratchNotKeptAfterHugeEncode(t *testing.T) {
	tk := loadNamed(t, "qwen3")
	sp := tk.rawTrie.tokens[0].content
	unit := "The quick brown fox \xff jumps over the lazy dog " + sp + "\n"
	huge := strings.Repeat(unit, (16<<20)/len(unit))
	const limit = 4 << 20
	for round := 0; round < 4; round++ {
		if _, err := tk.Encode(nil, huge, false); err != nil {
			t.Fatal(err)
		}
		var got []*encodeState
		for k := 0; k < 4; k++ {
			st := tk.scratch.Get().(*encodeState)
			got = append(got, st)
			if n := scratchBytes(st); n > limit {
				t.Fatalf("round %d: a pooled encodeState holds %d bytes of buffers after a huge encode (limit %d)", round, n, limit)
			}
		}
		for _, st := range got {
			tk.scratch.Put(st)
		}
	}
}
