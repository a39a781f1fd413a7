package tokenize

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// Normalizer step kinds.
const (
	normNFC uint8 = iota + 1
	normNFD
	normNFKC
	normNFKD
	normPrepend
	normReplace
	normLowercase
	normStrip
)

// normStep is one normalizer of a (flattened) Sequence.
type normStep struct {
	kind        uint8
	form        norm.Form
	str         string // Prepend: text; Replace: literal pattern
	content     string // Replace: replacement
	re          *regexp2.Regexp
	left, right bool // Strip
}

// normalize applies steps to s. It returns s itself when nothing changes, or a string that
// aliases buf (which it may grow); the caller keeps the result only until its next use of buf.
func normalize(steps []normStep, s string, buf *[2][]byte, it *norm.Iter) (string, error) {
	cur := s
	flip := 0
	for i := range steps {
		st := &steps[i]
		out := buf[flip][:0]
		changed := true
		switch st.kind {
		case normNFC, normNFD, normNFKC, normNFKD:
			if isASCII(cur) || st.form.QuickSpanString(cur) == len(cur) {
				changed = false
			} else {
				// norm.Iter, unlike Form.AppendString, does not allocate.
				it.InitString(st.form, cur)
				for !it.Done() {
					out = append(out, it.Next()...)
				}
				if cgj := "\u034f"; strings.Count(unsafeString(out), cgj) != strings.Count(cur, cgj) {
					out = normalizeSlow(out[:0], cur, st.form) // a stream-safe break was inserted
				}
			}
		case normPrepend:
			if cur == "" {
				changed = false
			} else {
				out = append(append(out, st.str...), cur...)
			}
		case normReplace:
			if st.re != nil {
				r, err := st.re.Replace(cur, st.content, -1, -1)
				if err != nil {
					return "", fmt.Errorf("tokenize: Replace regex %q: %w", st.re.String(), err)
				}
				if r == cur {
					changed = false
				} else {
					out = append(out, r...)
				}
			} else if !strings.Contains(cur, st.str) {
				changed = false
			} else {
				for {
					k := strings.Index(cur, st.str)
					if k < 0 {
						out = append(out, cur...)
						break
					}
					out = append(append(out, cur[:k]...), st.content...)
					cur = cur[k+len(st.str):]
				}
			}
		case normLowercase:
			// Rust's char::to_lowercase, per character (tables from the HF library).
			for _, r := range cur {
				if r < utf8.RuneSelf {
					if r >= 'A' && r <= 'Z' {
						r += 'a' - 'A'
					}
					out = append(out, byte(r))
					continue
				}
				if m, ok := lowerMulti[r]; ok {
					out = append(out, m...)
					continue
				}
				if l, ok := lowerMap[r]; ok {
					r = l
				}
				out = utf8.AppendRune(out, r)
			}
		case normStrip:
			t := cur
			if st.left {
				t = strings.TrimLeftFunc(t, isWhiteSpace)
			}
			if st.right {
				t = strings.TrimRightFunc(t, isWhiteSpace)
			}
			if t == cur {
				changed = false
			} else {
				out = append(out, t...)
			}
		}
		if changed {
			buf[flip] = out
			cur = unsafeString(out)
			flip ^= 1
		}
	}
	return cur, nil
}

func isWhiteSpace(r rune) bool { return unicode.Is(unicode.White_Space, r) }

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
