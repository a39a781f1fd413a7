package tokenize

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestTrieLongestAtBruteForce checks the trie's longest match (its runs of single-edge
// nodes compared at once) against a scan of every added token, for the real tokenizers'
// added tokens, at every position of texts built from tokens, their prefixes and noise.
func TestTrieLongestAtBruteForce(t *testing.T) {
	for _, name := range goldenNames {
		tk := loadNamed(t, name)
		tr := tk.rawTrie
		if tr.empty {
			continue
		}
		runs := 0
		for _, n := range tr.nodes {
			if len(n.run) > 1 {
				runs++
			}
		}
		if runs == 0 {
			t.Errorf("%s: no node has a run of two or more bytes: the test does not reach them", name)
		}
		rng := rand.New(rand.NewPCG(uint64(len(tr.tokens)), 7))
		var b strings.Builder
		for range 800 {
			tok := tr.tokens[rng.IntN(len(tr.tokens))].content
			switch rng.IntN(4) {
			case 0:
				b.WriteString(tok)
			case 1:
				b.WriteString(tok[:rng.IntN(len(tok)+1)]) // a prefix: a run that breaks off
			case 2:
				b.WriteString(tok[:len(tok)-1] + "x")
			default:
				b.WriteString(" text\n"[:rng.IntN(7)])
			}
		}
		s := b.String()
		for i := range len(s) {
			want, wantEnd := int32(-1), 0
			for k, tok := range tr.tokens {
				if strings.HasPrefix(s[i:], tok.content) && i+len(tok.content) > wantEnd {
					want, wantEnd = int32(k), i+len(tok.content)
				}
			}
			got, gotEnd := tr.longestAt(s, i)
			if got != want || (got >= 0 && gotEnd != wantEnd) {
				t.Fatalf("%s at %d (%q): longestAt %d..%d, brute force %d..%d", name, i, s[i:min(i+24, len(s))], got, gotEnd, want, wantEnd)
			}
		}
	}
}
