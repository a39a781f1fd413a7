// Package jsonlex is the lexical layer under kvgate's two JSON readers: the span scanner of
// request bodies (proxy/openai) and the parser of template values (tokenize/chat). It owns
// whitespace, the string grammar (escapes, control bytes, UTF-8), unescaping with UTF-16
// surrogate pairs, the number grammar and the literals; structure (objects, arrays, depth)
// stays with the readers, since one records spans and the other builds values.
//
// Every function works on a []byte and an offset and allocates nothing. Faults are reported
// as an Err kind plus the offset they were found at; each reader turns them into its own
// error values and messages.
package jsonlex

import (
	"bytes"
	"encoding/binary"
	"unicode/utf16"
	"unicode/utf8"
)

// Err is the kind of lexical fault; OK is none.
type Err uint8

const (
	OK           Err = iota
	Unterminated     // a string without its closing quote
	BadEscape        // a backslash before a byte that starts no escape
	BadHex           // \u not followed by four hex digits
	Control          // a byte below 0x20 inside a string
	BadUTF8          // a byte sequence inside a string that is not UTF-8 (ScanString only)
	BadNumber        // the number grammar broken: a digit was due at the offset
	BadLiteral       // not the literal expected
)

var errNames = [...]string{OK: "ok", Unterminated: "unterminated string", BadEscape: "bad escape",
	BadHex: `bad \u escape`, Control: "control character in string", BadUTF8: "invalid UTF-8 in string",
	BadNumber: "bad number", BadLiteral: "invalid literal"}

func (e Err) String() string {
	if int(e) < len(errNames) {
		return errNames[e]
	}
	return "unknown"
}

// SkipWS returns the offset of the first byte at or after i that is not JSON whitespace.
func SkipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// ScanString checks the string whose opening quote is b[i] and returns the offset after its
// closing quote and whether it holds escapes. It validates escapes, control bytes and UTF-8.
// On a fault end is where it was found: the control byte, the first byte of the bad UTF-8
// sequence, the backslash of the bad escape, or len(b) for a missing closing quote (which
// wins over a fault before it).
//
// It jumps from one byte that is not plain ASCII to the next with plainEnd (32 bytes a
// step with AVX2: prompts are long strings, mostly ASCII), one pass that finds the closing
// quote, the escapes, control bytes and the start of every multi-byte sequence at once.
// ScanPlainLax and AppendEscapedLax are the same walk for the other reader; each is one
// tight loop because the request path pays for every call and test a shared one adds
// (measured).
func ScanString(b []byte, i int) (end int, esc bool, err Err) {
	i++
	// Short strings (keys, roles) end before a vectorized search would pay off.
	for e := min(i+16, len(b)); i < e && plainASCII[b[i]]; i++ {
	}
	for {
		if i < len(b) && plainASCII[b[i]] {
			i += plainEnd(b[i:])
		}
		if i >= len(b) {
			return len(b), false, Unterminated
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, esc, OK
		case c == '\\':
			n := 2
			if i+1 >= len(b) {
				return len(b), false, Unterminated
			}
			if simpleEscape[b[i+1]] == 0 {
				if n = escapeLen(b[i:]); n == 0 {
					return faultOrUnterminated(b, i, escapeErr(b[i+1]))
				}
			}
			esc = true
			i += n
		case c < 0x20:
			return faultOrUnterminated(b, i, Control)
		default: // a multi-byte sequence, and those right after it
			for i < len(b) && b[i] >= 0x80 {
				r, size := utf8.DecodeRune(b[i:])
				if r == utf8.RuneError && size <= 1 {
					return faultOrUnterminated(b, i, BadUTF8)
				}
				i += size
			}
		}
	}
}

// faultOrUnterminated reports the fault found at b[i], unless no quote follows it: then
// the string is unterminated, which a reader that first looks for the closing quote (as
// this one did before plainEnd) reports instead.
func faultOrUnterminated(b []byte, i int, err Err) (int, bool, Err) {
	if bytes.IndexByte(b[i+1:], '"') < 0 {
		return len(b), false, Unterminated
	}
	return i, false, err
}

// plainEndSWAR is plainEnd eight bytes at a time: a word holding none of those bytes
// passes whole; the first word that may is searched byte by byte.
func plainEndSWAR(s []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := binary.LittleEndian.Uint64(s[i:])
		q, bs := x^0x22*ones, x^0x5c*ones
		// A zero byte of q or bs (the quote or the backslash) borrows into its high bit; so
		// does a byte below 0x20 of x; a byte from 0x80 has it set.
		if ((q-ones)&^q|(bs-ones)&^bs|(x-0x20*ones)|x)&highs != 0 {
			break
		}
	}
	for ; i < len(s) && plainASCII[s[i]]; i++ {
	}
	return i
}

// ScanPlainLax checks the string whose opening quote is b[i] as ScanString does but without
// the UTF-8 check (any byte from 0x20 up other than the quote and the backslash stands for
// itself: tokenize/chat passes invalid UTF-8 through, as it reaches Python's json module
// already decoded), up to its closing quote or its first escape. Without escapes it returns
// the offset after the closing quote; with one, esc and the offset of its backslash, where
// AppendEscapedLax goes on. Faults are ScanString's. It is split from the decoding so that a
// plain string (most of them) costs one small call.
func ScanPlainLax(b []byte, i int) (end int, esc bool, err Err) {
	i++
	for e := min(i+16, len(b)); i < e && plainLax[b[i]]; i++ {
	}
	if i < len(b) && b[i] == '"' {
		return i + 1, false, OK
	}
	q := bytes.IndexByte(b[i:], '"')
	if q < 0 {
		return len(b), false, Unterminated
	}
	q += i
	run := q
	if j := bytes.IndexByte(b[i:q], '\\'); j >= 0 {
		run = i + j
	}
	if k := ctlIndex(b[i:run]); k >= 0 {
		return i + k, false, Control
	}
	if run == q {
		return q + 1, false, OK
	}
	return run, true, OK
}

// AppendEscapedLax decodes the rest of a string ScanPlainLax stopped in, from the backslash
// at b[i] on (its contents began at b[from]), checking it as ScanPlainLax does, in one pass:
// it appends the whole decoded contents to dst (as AppendUnescaped would) and returns the
// offset after the closing quote. Faults are ScanString's.
func AppendEscapedLax(dst, b []byte, from, i int) (out []byte, end int, err Err) {
	dst = append(dst, b[from:i]...)
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return dst, len(b), Unterminated
		}
		q += i
		for {
			run := q
			if j := bytes.IndexByte(b[i:q], '\\'); j >= 0 {
				run = i + j
			}
			if k := ctlIndex(b[i:run]); k >= 0 {
				return dst, i + k, Control
			}
			dst = append(dst, b[i:run]...)
			if run == q {
				return dst, q + 1, OK
			}
			n := 2 // a backslash before q has a byte after it
			if c := simpleEscape[b[run+1]]; c != 0 {
				dst = append(dst, c)
			} else if dst, n = appendEscape(dst, b[run:]); n == 0 {
				return dst, run, escapeErr(b[run+1])
			}
			if i = run + n; i > q {
				break // the quote was escaped: find the next one
			}
		}
	}
}

// simpleEscape maps the letter of each two-byte escape to the byte it stands for (0: none),
// so that the loops decode the common escapes without a call.
var simpleEscape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func escapeErr(letter byte) Err {
	if letter == 'u' {
		return BadHex
	}
	return BadEscape
}

// escapeLen returns the length of the valid escape s starts with (s[0] is a backslash), or 0.
func escapeLen(s []byte) int {
	if len(s) < 2 {
		return 0
	}
	switch s[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if len(s) >= 6 {
			if _, ok := hex4(s[2:6]); ok {
				return 6
			}
		}
	}
	return 0
}

// appendEscape appends what the escape s starts with stands for and returns its length: a
// \u escape of a UTF-16 surrogate pair takes the pair, a lone surrogate stands for U+FFFD.
// 0 when s starts with no valid escape.
func appendEscape(dst, s []byte) ([]byte, int) {
	if len(s) < 2 {
		return dst, 0
	}
	switch c := s[1]; c {
	case '"', '\\', '/':
		return append(dst, c), 2
	case 'b':
		return append(dst, '\b'), 2
	case 'f':
		return append(dst, '\f'), 2
	case 'n':
		return append(dst, '\n'), 2
	case 'r':
		return append(dst, '\r'), 2
	case 't':
		return append(dst, '\t'), 2
	case 'u':
		if len(s) < 6 {
			return dst, 0
		}
		r, ok := hex4(s[2:6])
		if !ok {
			return dst, 0
		}
		if utf16.IsSurrogate(r) && len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
			if lo, ok := hex4(s[8:12]); ok {
				if pair := utf16.DecodeRune(r, lo); pair != utf8.RuneError {
					return utf8.AppendRune(dst, pair), 12
				}
			}
		}
		return utf8.AppendRune(dst, r), 6 // a lone surrogate appends U+FFFD
	}
	return dst, 0
}

// ctlIndex returns the index of the first control byte (below 0x20, which a JSON string
// must escape) in s, or -1.
func ctlIndex(s []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	rest := s
	// A byte below 0x20 borrows into its high bit; one from 0x80 is masked out by &^ x.
	for len(rest) >= 32 {
		w, x := binary.LittleEndian.Uint64(rest), binary.LittleEndian.Uint64(rest[8:])
		y, z := binary.LittleEndian.Uint64(rest[16:]), binary.LittleEndian.Uint64(rest[24:])
		if ((w-0x20*ones)&^w|(x-0x20*ones)&^x|(y-0x20*ones)&^y|(z-0x20*ones)&^z)&highs != 0 {
			break
		}
		rest = rest[32:]
	}
	for i, c := range rest {
		if c < 0x20 {
			return len(s) - len(rest) + i
		}
	}
	return -1
}

// plainASCII marks the bytes a string holds as themselves and that need no UTF-8 check:
// printable ASCII other than the quote and the backslash. plainLax adds every byte from 0x80.
var plainASCII, plainLax = func() (a, l [256]bool) {
	for c := 0x20; c < 256; c++ {
		l[c] = c != '"' && c != '\\'
		a[c] = l[c] && c < 0x80
	}
	return a, l
}()

func hex4(h []byte) (rune, bool) {
	var r rune
	for _, c := range h[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// AppendUnescaped appends the decoded bytes of s, the contents of a string ScanString
// accepted (without its quotes), to dst. A \u escape of a UTF-16 surrogate pair decodes to
// its code point; a lone surrogate decodes to U+FFFD, as encoding/json and the engines'
// tokenizers see it. Bytes that are not escapes are copied as they are. On bytes no scan
// accepted it stops at the first broken escape, without panicking.
func AppendUnescaped(dst, s []byte) []byte {
	for {
		j := bytes.IndexByte(s, '\\')
		if j < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:j]...)
		n := 2
		if j+1 < len(s) && simpleEscape[s[j+1]] != 0 {
			dst = append(dst, simpleEscape[s[j+1]])
		} else if dst, n = appendEscape(dst, s[j:]); n == 0 {
			return dst
		}
		s = s[j+n:]
	}
}

// ScanNumber checks the number starting at b[i] (a '-' or a digit) and returns the offset
// after it and whether it is an integer (no fraction, no exponent). On a fault end is where a
// digit was due.
func ScanNumber(b []byte, i int) (end int, isInt bool, err Err) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	// The integer part: one 0, or digits that do not start with 0.
	s := i
	i = digits(b, i)
	switch {
	case i == s:
		return i, false, BadNumber
	case b[s] == '0':
		i = s + 1
	}
	if i >= len(b) || b[i] != '.' && b[i] != 'e' && b[i] != 'E' {
		return i, true, OK
	}
	if b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return j, false, BadNumber
		}
		i = j
		if i >= len(b) || b[i] != 'e' && b[i] != 'E' {
			return i, false, OK
		}
	}
	i++ // the exponent's e
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		i++
	}
	j := digits(b, i)
	if j == i {
		return i, false, BadNumber
	}
	return j, false, OK
}

// digits returns the offset after the run of digits at b[i] (i itself when there is none).
func digits(b []byte, i int) int {
	for i < len(b) && b[i]-'0' <= 9 {
		i++
	}
	return i
}

// Literal checks that word (true, false, null, or a reader's extension such as NaN) stands at
// b[i] and returns the offset after it; on a fault end is i.
func Literal(b []byte, i int, word string) (end int, err Err) {
	if len(b)-i >= len(word) && string(b[i:i+len(word)]) == word {
		return i + len(word), OK
	}
	return i, BadLiteral
}
