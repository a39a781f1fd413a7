package tokenize

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	id                 uint32
	content            string
	singleWord, lstrip bool
	rstrip, normalized bool
	special            bool
}

// tokenTrie finds added tokens in text, leftmost-longest, non-overlapping (what HF's
// Aho-Corasick with MatchKind::LeftmostLongest does), then applies single_word, lstrip and
// rstrip as HF AddedVocabulary::find_matches.
type tokenTrie struct {
	root   [256]int32 // child of the root per first byte, 0 = none
	nodes  []trieNode // nodes[0] is the root
	tokens []addedToken
	empty  bool
	// onlyFirst is the first byte of every token when they all share one (then candidate
	// positions are found with strings.IndexByte); -1 otherwise.
	onlyFirst int
}

type trieNode struct {
	edges []trieEdge
	token int32 // index into tokens, -1 when no token ends here
	// run: when the node has one edge, the labels of the chain of single-edge nodes from
	// here to runTo, the first node on it that ends a token or branches. Tokens share
	// short prefixes ("<|im_", "<|vision_") and then run alone: one string compare
	// instead of an edge scan per byte, for each of the 2 added tokens of every message.
	run   string
	runTo int32
	// dense: the children by byte, for a node with more than denseEdges edges (the nodes
	// right after "<" and "<|" fan out to dozens), so a step is one load, not an edge scan.
	dense *[256]int32
}

// denseEdges is how many edges a node may scan before it gets a dense table.
const denseEdges = 4

type trieEdge struct {
	b  byte
	to int32
}

func newTokenTrie(tokens []addedToken, pattern func(addedToken) string) *tokenTrie {
	t := &tokenTrie{nodes: []trieNode{{token: -1}}, empty: true}
	for _, tok := range tokens {
		p := pattern(tok)
		if p == "" {
			continue
		}
		t.empty = false
		cur := int32(0)
		for i := 0; i < len(p); i++ {
			b := p[i]
			var next int32
			if cur == 0 {
				next = t.root[b]
			} else {
				for _, e := range t.nodes[cur].edges {
					if e.b == b {
						next = e.to
						break
					}
				}
			}
			if next == 0 {
				next = int32(len(t.nodes))
				t.nodes = append(t.nodes, trieNode{token: -1})
				if cur == 0 {
					t.root[b] = next
				} else {
					t.nodes[cur].edges = append(t.nodes[cur].edges, trieEdge{b, next})
				}
			}
			cur = next
		}
		if t.nodes[cur].token < 0 { // the first of equal patterns wins
			t.nodes[cur].token = int32(len(t.tokens))
			t.tokens = append(t.tokens, tok)
		}
	}
	for i := range t.nodes {
		n := &t.nodes[i]
		if len(n.edges) > denseEdges {
			n.dense = new([256]int32)
			for _, e := range n.edges {
				n.dense[e.b] = e.to
			}
		}
		if len(n.edges) != 1 {
			continue
		}
		var run []byte
		to := int32(i)
		for len(t.nodes[to].edges) == 1 && (to == int32(i) || t.nodes[to].token < 0) {
			e := t.nodes[to].edges[0]
			run, to = append(run, e.b), e.to
		}
		n.run, n.runTo = string(run), to
	}
	t.onlyFirst = -1
	for b, n := range t.root {
		if n != 0 {
			if t.onlyFirst != -1 {
				t.onlyFirst = -1
				break
			}
			t.onlyFirst = b
		}
	}
	return t
}

// longestAt returns the token index and end of the longest token starting at i, or -1.
func (t *tokenTrie) longestAt(s string, i int) (int32, int) {
	cur := t.root[s[i]]
	if cur == 0 {
		return -1, 0
	}
	best, bestEnd := int32(-1), 0
	for j := i + 1; ; {
		n := &t.nodes[cur]
		if n.token >= 0 {
			best, bestEnd = n.token, j
		}
		if n.run != "" { // no token ends inside a run: it matches whole or ends the search
			if !strings.HasPrefix(s[j:], n.run) {
				break
			}
			cur, j = n.runTo, j+len(n.run)
			continue
		}
		if j >= len(s) {
			break
		}
		b := s[j]
		next := int32(0)
		if n.dense != nil {
			next = n.dense[b]
		} else {
			for _, e := range n.edges {
				if e.b == b {
					next = e.to
					break
				}
			}
		}
		if next == 0 {
			break
		}
		cur, j = next, j+1
	}
	return best, bestEnd
}

// addedMatch is one added token found in a piece of text: [start, end) after stripping.
type addedMatch struct {
	start, end int
	id         uint32
}

// find appends the matches in s to out, as HF AddedVocabulary::find_matches.
func (t *tokenTrie) find(out []addedMatch, s string) []addedMatch {
	if t.empty {
		return out
	}
	startOffset := 0
	for i := 0; i < len(s); {
		if t.onlyFirst >= 0 {
			k := strings.IndexByte(s[i:], byte(t.onlyFirst))
			if k < 0 {
				break
			}
			i += k
		} else if t.root[s[i]] == 0 {
			i++
			continue
		}
		tk, end := t.longestAt(s, i)
		if tk < 0 {
			i++
			continue
		}
		start, stop := i, end
		i = end
		tok := &t.tokens[tk]
		if tok.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.lstrip {
			ns := start
			for ns > 0 {
				r, n := lastRune(s[:ns])
				if !unicode.Is(unicode.White_Space, r) {
					break
				}
				ns -= n
			}
			start = max(ns, startOffset)
		}
		if tok.rstrip {
			for stop < len(s) {
				r, n := firstRune(s[stop:])
				if !unicode.Is(unicode.White_Space, r) {
					break
				}
				stop += n
			}
		}
		out = append(out, addedMatch{start, stop, tok.id})
		startOffset = stop
	}
	return out
}

// isWordChar is the regex class \w that HF's single_word check uses (Alphabetic, marks,
// decimal digits, connector punctuation, join controls; checked against the library: '²' is not
// a word character, U+0301, U+2167 and U+200D are).
func isWordChar(r rune) bool {
	if r < utf8.RuneSelf {
		return r == '_' || (r|0x20 >= 'a' && r|0x20 <= 'z') || (r >= '0' && r <= '9')
	}
	return classOf(r)&(cL|cM) != 0 ||
		unicode.In(r, unicode.Nd, unicode.Nl, unicode.Pc, unicode.Other_Alphabetic, unicode.Join_Control)
}

func endsWithWord(s string) bool {
	if s == "" {
		return false
	}
	r, _ := lastRune(s)
	return isWordChar(r)
}

func startsWithWord(s string) bool {
	if s == "" {
		return false
	}
	r, _ := firstRune(s)
	return isWordChar(r)
}
