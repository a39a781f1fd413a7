package tokenize

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// Split delimiter behaviours (HF SplitDelimiterBehavior).
const (
	behRemoved uint8 = iota
	behIsolated
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

func parseBehavior(s string) (uint8, error) {
	switch strings.ToLower(s) {
	case "removed":
		return behRemoved, nil
	case "isolated":
		return behIsolated, nil
	case "mergedwithprevious", "merged_with_previous":
		return behMergedWithPrevious, nil
	case "mergedwithnext", "merged_with_next":
		return behMergedWithNext, nil
	case "contiguous":
		return behContiguous, nil
	}
	return 0, fmt.Errorf("unknown split behavior %q", s)
}

// pattern finds the matches of a Split pattern: a literal string, a hand-coded scanner for a
// known regex, or a backtracking regex (regexp2) for an unknown one.
type pattern struct {
	scan      uint8  // scanCL100K, ...; 0 for lit or re
	maxDigits int    // scanCL100K, scanDigits
	lit       string // literal pattern (non-empty), when scan == 0 and re == nil
	re        *regexp2.Regexp
	class     uint16 // scanCharClass: one character of this class per match
}

func newRegexPattern(src string) (*pattern, error) {
	switch src {
	case reQwen2:
		return &pattern{scan: scanCL100K, maxDigits: 1}, nil
	case reCL100K:
		return &pattern{scan: scanCL100K, maxDigits: 3}, nil
	case reO200K:
		return &pattern{scan: scanO200K}, nil
	case reDeepSeekDigits:
		return &pattern{scan: scanDigits, maxDigits: 3}, nil
	case reDeepSeekCJK:
		return &pattern{scan: scanDeepSeekCJK}, nil
	case reDeepSeekMain:
		return &pattern{scan: scanDeepSeekMain}, nil
	case reGPT2:
		return &pattern{scan: scanGPT2}, nil
	}
	re, err := regexp2.Compile(src, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("split regex %q: %w", src, err)
	}
	re.MatchTimeout = regexTimeout
	return &pattern{re: re}, nil
}

// next returns the first match in s at or after byte offset from, or (-1, -1).
func (p *pattern) next(s string, from int) (int, int) {
	switch p.scan {
	case scanCL100K, scanO200K, scanDeepSeekMain, scanGPT2:
		for i := from; i < len(s); {
			var e int
			switch p.scan {
			case scanCL100K:
				e = matchCL100K(s, i, p.maxDigits)
			case scanO200K:
				e = matchO200K(s, i)
			case scanDeepSeekMain:
				e = matchDeepSeekMain(s, i)
			default:
				e = matchGPT2(s, i)
			}
			if e > i {
				return i, e
			}
			_, n := classAt(s, i)
			i += n
		}
	case scanDigits:
		for i := from; i < len(s); {
			c, n := classAt(s, i)
			if c&cN != 0 {
				return i, digitsEnd(s, i, p.maxDigits)
			}
			i += n
		}
	case scanCharClass:
		for i := from; i < len(s); {
			c, n := classAt(s, i)
			if c&p.class != 0 {
				return i, i + n
			}
			i += n
		}
	case scanDeepSeekCJK:
		for i := from; i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			if isDeepSeekCJK(r) {
				j := i + n
				for j < len(s) {
					r, n := utf8.DecodeRuneInString(s[j:])
					if !isDeepSeekCJK(r) {
						break
					}
					j += n
				}
				return i, j
			}
			i += n
		}
	default:
		if k := strings.Index(s[from:], p.lit); k >= 0 {
			return from + k, from + k + len(p.lit)
		}
	}
	return -1, -1
}

// reMatches runs the fallback regex over s once and returns its matches as byte offsets
// (regexp2 reports rune offsets). Empty matches are skipped, as the HF engine's are.
func (p *pattern) reMatches(s string) ([]span, error) {
	runes := []rune(s)
	byteAt := make([]int32, len(runes)+1)
	b := 0
	for i, r := range runes {
		byteAt[i] = int32(b)
		b += utf8.RuneLen(r)
	}
	byteAt[len(runes)] = int32(b)
	var out []span
	m, err := p.re.FindRunesMatch(runes)
	for ; err == nil && m != nil; m, err = p.re.FindNextMatch(m) {
		if m.Length > 0 {
			out = append(out, span{byteAt[m.Index], byteAt[m.Index+m.Length]})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("tokenize: split regex %q: %w", p.re.String(), err)
	}
	return out, nil
}

// regexTimeout bounds one fallback-regex search: a pattern that backtracks catastrophically on
// some input fails that encode instead of hanging it.
const regexTimeout = 2 * time.Second

// span is a piece of text [start, end) in the buffer a pre-tokenizer step works on.
type span struct{ start, end int32 }

// splitStep applies a Split pre-tokenizer to one piece s, appending the resulting pieces
// (as offsets relative to base) to out. It follows HF NormalizedString::split: matches
// (inverted when invert) are combined with the gaps per behavior; empty pieces are dropped.
func splitStep(out []span, s string, base int32, p *pattern, beh uint8, invert bool, errp *error) []span {
	// Pieces are produced as (start, end, isMatch) in order; combine on the fly.
	prevEnd := 0
	havePrev := false // for merge behaviors: whether out has a piece from this call
	prevMatch := false
	pending := -1 // MergedWithNext: start of a delimiter waiting for the next piece
	emit := func(start, end int, isMatch bool) {
		if invert {
			isMatch = !isMatch
		}
		switch beh {
		case behIsolated:
			out = append(out, span{base + int32(start), base + int32(end)})
		case behRemoved:
			if !isMatch {
				out = append(out, span{base + int32(start), base + int32(end)})
			}
		case behContiguous:
			if havePrev && isMatch == prevMatch {
				out[len(out)-1].end = base + int32(end)
			} else {
				out = append(out, span{base + int32(start), base + int32(end)})
			}
			havePrev = true
		case behMergedWithPrevious:
			if havePrev && isMatch && !prevMatch {
				out[len(out)-1].end = base + int32(end)
			} else {
				out = append(out, span{base + int32(start), base + int32(end)})
			}
			havePrev = true
		case behMergedWithNext:
			// Processed right to left in HF: a match merges into the piece after it unless that
			// piece is itself a match. Left to right: hold a match until we see what follows.
			if pending >= 0 {
				if !isMatch {
					out = append(out, span{base + int32(pending), base + int32(end)})
					pending = -1
					prevMatch = isMatch
					return
				}
				out = append(out, span{base + int32(pending), base + int32(start)})
				pending = -1
			}
			if isMatch {
				pending = start
			} else {
				out = append(out, span{base + int32(start), base + int32(end)})
			}
		}
		prevMatch = isMatch
	}
	if len(s) == 0 {
		return out
	}
	if p.re != nil {
		ms, err := p.reMatches(s)
		if err != nil && *errp == nil {
			*errp = err
		}
		for _, m := range ms {
			ms, me := int(m.start), int(m.end)
			if ms > prevEnd {
				emit(prevEnd, ms, false)
			}
			emit(ms, me, true)
			prevEnd = me
		}
	} else {
		for from := 0; from < len(s); {
			ms, me := p.next(s, from)
			if ms < 0 {
				break
			}
			if ms > prevEnd {
				emit(prevEnd, ms, false)
			}
			emit(ms, me, true)
			prevEnd = me
			from = me
		}
	}
	if prevEnd < len(s) {
		emit(prevEnd, len(s), false)
	}
	if pending >= 0 {
		out = append(out, span{base + int32(pending), base + int32(len(s))})
	}
	return out
}
