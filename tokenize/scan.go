package tokenize

import (
	"unicode/utf8"
)

// The split regexes of the known tokenizer families, hand-coded as scanners. Each matchAt
// reproduces the backtracking regex engine's result for one match attempt at position i:
// alternatives are tried in order, quantifiers are greedy, and the first alternative that
// matches wins. The regex sources are kept verbatim so a tokenizer.json pattern can be
// recognised by exact string comparison.
const (
	// Qwen2 / Qwen2.5 / Qwen3 (cl100k with single digits).
	reQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Llama 3 / cl100k_base.
	reCL100K = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// GPT-4o / o200k_base.
	reO200K = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// DeepSeek V3 (three Split steps).
	reDeepSeekDigits = `\p{N}{1,3}`
	reDeepSeekCJK    = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	reDeepSeekMain   = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	// GPT-2 ByteLevel pre-tokenizer (use_regex=true).
	reGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// scanner kinds
const (
	scanCL100K uint8 = iota + 1 // with maxDigits 1 (Qwen) or 3 (Llama 3)
	scanO200K
	scanDigits // \p{N}{1,maxDigits}
	scanDeepSeekCJK
	scanDeepSeekMain
	scanGPT2
	scanCharClass
)

// classAt returns the class bits and byte size of the character at s[i] (0, 0 at the end).
func classAt(s string, i int) (uint16, int) {
	if i >= len(s) {
		return 0, 0
	}
	c := s[i]
	if c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return classOf(r), n
}

// runEnd returns the end of the run of characters starting at i whose class has any of bits.
func runEnd(s string, i int, bits uint16) int {
	for i < len(s) {
		if b := s[i]; b < utf8.RuneSelf {
			if asciiClass[b]&bits == 0 {
				break
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if classOf(r)&bits == 0 {
			break
		}
		i += n
	}
	return i
}

// contraction matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at i (s[i] == '\”) and returns its end, or
// -1. Case folding follows the regex engine: U+017F LATIN SMALL LETTER LONG S folds to 's'.
func contraction(s string, i int, foldCase bool) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return -1
	}
	c := s[i+1]
	if foldCase && c >= 'A' && c <= 'Z' {
		c += 'a' - 'A'
	}
	switch c {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if i+2 < len(s) {
			e := s[i+2]
			if e == 'e' || (foldCase && e == 'E') {
				return i + 3
			}
		}
	case 'l':
		if i+2 < len(s) {
			e := s[i+2]
			if e == 'l' || (foldCase && e == 'L') {
				return i + 3
			}
		}
	case 0xc5: // U+017F is C5 BF
		if foldCase && i+2 < len(s) && s[i+2] == 0xbf {
			return i + 3
		}
	}
	return -1
}

// spaceTail matches the whitespace alternatives shared by the GPT-style patterns at i, where
// s[i] is whitespace: `\s*[\r\n]+` (when crlf), then `\s+(?!\S)`, then `\s+`.
func spaceTail(s string, i int, crlf bool) int {
	end := runEnd(s, i, cSpace)
	if crlf {
		// \s* backtracks to the last \r or \n of the run; multi-byte spaces hold no 0x0A/0x0D bytes.
		for k := end - 1; k >= i; k-- {
			if s[k] == '\r' || s[k] == '\n' {
				return k + 1
			}
		}
	}
	if end == len(s) {
		return end
	}
	// Followed by a non-space: \s+(?!\S) gives back the last space, if the run has two or more.
	last := end - 1
	for last > i && s[last]&0xc0 == 0x80 {
		last--
	}
	if last > i {
		return last
	}
	return end
}

// matchCL100K: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func matchCL100K(s string, i, maxDigits int) int {
	if s[i] == '\'' {
		if e := contraction(s, i, true); e > 0 {
			return e
		}
	}
	c, n := classAt(s, i)
	if c&cL != 0 {
		return runEnd(s, i+n, cL)
	}
	if c&(cCRLF|cL|cN) == 0 {
		if c2, n2 := classAt(s, i+n); c2&cL != 0 {
			return runEnd(s, i+n+n2, cL)
		}
	}
	if c&cN != 0 {
		return digitsEnd(s, i, maxDigits)
	}
	if e := punctRun(s, i, c, cSpace|cL|cN, false); e > 0 {
		return e
	}
	if c&cSpace != 0 {
		return spaceTail(s, i, true)
	}
	return -1
}

// digitsEnd matches \p{N}{1,max} at i (s[i] is a number).
func digitsEnd(s string, i, max int) int {
	for k := 0; k < max && i < len(s); k++ {
		c, n := classAt(s, i)
		if c&cN == 0 {
			break
		}
		i += n
	}
	return i
}

// punctRun matches ` ?[^<excl>]+[\r\n]*` (with '/' in the tail class when slash) at i,
// where c is the class of s[i]. Returns -1 when it does not match.
func punctRun(s string, i int, c uint16, excl uint16, slash bool) int {
	j := i
	if s[i] == ' ' {
		if c2, _ := classAt(s, i+1); i+1 < len(s) && c2&excl == 0 {
			j = i + 1
		} else {
			return -1
		}
	} else if c&excl != 0 {
		return -1
	}
	for j < len(s) {
		c, n := classAt(s, j)
		if c&excl != 0 {
			break
		}
		j += n
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || (slash && s[j] == '/')) {
		j++
	}
	return j
}

const (
	o200kUpper = cLu | cLt | cLm | cLo | cM
	o200kLower = cLl | cLm | cLo | cM
)

// o200kAlt1 matches [U]*[W]+ from j (U, W: the o200k upper and lower classes), or -1.
func o200kAlt1(s string, j int) int {
	k, lastW := j, -1
	for k < len(s) {
		c, n := classAt(s, k)
		if c&o200kUpper == 0 {
			break
		}
		if c&o200kLower != 0 {
			lastW = k
		}
		k += n
	}
	if c, _ := classAt(s, k); c&o200kLower != 0 {
		return runEnd(s, k, o200kLower)
	}
	if lastW < 0 {
		return -1
	}
	_, n := classAt(s, lastW)
	return lastW + n
}

// o200kAlt2 matches [U]+[W]* from j, or -1.
func o200kAlt2(s string, j int) int {
	if c, _ := classAt(s, j); c&o200kUpper == 0 {
		return -1
	}
	k := runEnd(s, j, o200kUpper)
	return runEnd(s, k, o200kLower)
}

func withContraction(s string, e int) int {
	if e < len(s) && s[e] == '\'' {
		if e2 := contraction(s, e, true); e2 > 0 {
			return e2
		}
	}
	return e
}

// matchO200K: the GPT-4o pattern (reO200K).
func matchO200K(s string, i int) int {
	c, n := classAt(s, i)
	prefix := c&(cCRLF|cL|cN) == 0
	if prefix {
		if e := o200kAlt1(s, i+n); e >= 0 {
			return withContraction(s, e)
		}
	}
	if e := o200kAlt1(s, i); e >= 0 {
		return withContraction(s, e)
	}
	if prefix {
		if e := o200kAlt2(s, i+n); e >= 0 {
			return withContraction(s, e)
		}
	}
	if e := o200kAlt2(s, i); e >= 0 {
		return withContraction(s, e)
	}
	if c&cN != 0 {
		return digitsEnd(s, i, 3)
	}
	if e := punctRun(s, i, c, cSpace|cL|cN, true); e > 0 {
		return e
	}
	if c&cSpace != 0 {
		return spaceTail(s, i, true)
	}
	return -1
}

func isASCIIPunct(b byte) bool {
	return (b >= '!' && b <= '/') || (b >= ':' && b <= '@') || (b >= '[' && b <= '`') || (b >= '{' && b <= '~')
}

func isASCIILetter(b byte) bool { return (b|0x20) >= 'a' && (b|0x20) <= 'z' }

// matchDeepSeekMain: the third DeepSeek V3 split (reDeepSeekMain).
func matchDeepSeekMain(s string, i int) int {
	if isASCIIPunct(s[i]) && i+1 < len(s) && isASCIILetter(s[i+1]) {
		j := i + 1
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j
	}
	c, n := classAt(s, i)
	if c&(cCRLF|cL|cP|cS) == 0 {
		if c2, _ := classAt(s, i+n); c2&(cL|cM) != 0 {
			return runEnd(s, i+n, cL|cM)
		}
	}
	if c&(cL|cM) != 0 {
		return runEnd(s, i, cL|cM)
	}
	// ` ?[\p{P}\p{S}]+[\r\n]*`
	j := i
	if s[i] == ' ' {
		if c2, _ := classAt(s, i+1); c2&(cP|cS) != 0 {
			j = i + 1
		}
	}
	if c2, _ := classAt(s, j); c2&(cP|cS) != 0 {
		j = runEnd(s, j, cP|cS)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	if c&cSpace != 0 {
		return spaceTail(s, i, true)
	}
	return -1
}

// matchGPT2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func matchGPT2(s string, i int) int {
	if s[i] == '\'' {
		if e := contraction(s, i, false); e > 0 {
			return e
		}
	}
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		j = i + 1
	}
	for _, bits := range [2]uint16{cL, cN} {
		if c, _ := classAt(s, j); c&bits != 0 {
			return runEnd(s, j, bits)
		}
		if j != i { // backtrack the optional space
			if c, _ := classAt(s, i); c&bits != 0 {
				return runEnd(s, i, bits)
			}
		}
	}
	c, _ := classAt(s, i)
	if e := punctRun(s, i, c, cSpace|cL|cN, false); e > 0 {
		// punctRun also eats a [\r\n]* tail, which GPT-2's pattern does not have: redo without.
		k := i
		if s[i] == ' ' {
			k++
		}
		return runEndNot(s, k, cSpace|cL|cN)
	}
	if c&cSpace != 0 {
		return spaceTail(s, i, false)
	}
	return -1
}

// runEndNot returns the end of the run starting at i of characters having none of bits.
func runEndNot(s string, i int, bits uint16) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c&bits != 0 {
			break
		}
		i += n
	}
	return i
}

// isDeepSeekCJK reports whether r is in [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff].
func isDeepSeekCJK(r rune) bool {
	return (r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x309f) || (r >= 0x30a0 && r <= 0x30ff)
}
