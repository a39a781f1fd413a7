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
// sequence, the backslash of the bad escape, or len(b) for a missing closing quote.
func ScanString(b []byte, i int) (end int, esc bool, err Err) {
	// Short strings (keys, roles) end before a vectorized search would pay off, and end
	// here: one call, no mode to test.
	j := i + 1
	for e := min(j+16, len(b)); j < e && plainASCII[b[j]]; j++ {
	}
	if j < len(b) && b[j] == '"' {
		return j + 1, false, OK
	}
	return scanRest(b, j, true)
}

// ScanStringLax is ScanString without the UTF-8 check: any byte from 0x20 up other than the
// quote and the backslash stands for itself (tokenize/chat passes invalid UTF-8 through, as
// it reaches Python's json module already decoded).
func ScanStringLax(b []byte, i int) (end int, esc bool, err Err) {
	j := i + 1
	for e := min(j+16, len(b)); j < e && plainLax[b[j]]; j++ {
	}
	if j < len(b) && b[j] == '"' {
		return j + 1, false, OK
	}
	return scanRest(b, j, false)
}

// scanRest goes on from b[i], inside a string, to its end (strict: with the UTF-8 check).
// It finds the next quote and backslash with bytes.IndexByte (vectorized: prompts are long
// strings) and checks the plain run between them eight bytes at a time, instead of walking
// every byte.
func scanRest(b []byte, i int, strict bool) (int, bool, Err) {
	esc := false
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return len(b), false, Unterminated
		}
		q += i
		// Every backslash before q starts an escape; one may escape q itself, and then the
		// string goes on past it.
		for {
			run := q
			if j := bytes.IndexByte(b[i:q], '\\'); j >= 0 {
				run = i + j
			}
			if strict {
				if k, err := checkUTF8Run(b[i:run]); err != OK {
					return i + k, false, err
				}
			} else if k := ctlIndex(b[i:run]); k >= 0 {
				return i + k, false, Control
			}
			if run == q {
				return q + 1, esc, OK
			}
			esc = true
			i = run
			// A backslash before q has a byte after it.
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return i, false, BadHex
				}
				if _, ok := hex4(b[i+2 : i+6]); !ok {
					return i, false, BadHex
				}
				i += 6
			default:
				return i, false, BadEscape
			}
			if i > q {
				break // the quote was escaped: find the next one
			}
		}
	}
}

// checkUTF8Run validates a run of string bytes holding no quote or backslash: no control
// byte, valid UTF-8. Runs of ASCII go sixteen and eight bytes at a time. It returns the
// offset of the fault, if any.
func checkUTF8Run(s []byte) (int, Err) {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	n := len(s)
	for len(s) > 0 {
		// A byte below 0x20 borrows into its high bit; a byte from 0x80 has it set.
		for len(s) >= 16 {
			x, y := binary.LittleEndian.Uint64(s), binary.LittleEndian.Uint64(s[8:])
			if ((x-0x20*ones)|x|(y-0x20*ones)|y)&highs != 0 {
				break
			}
			s = s[16:]
		}
		for len(s) >= 8 {
			if x := binary.LittleEndian.Uint64(s); ((x-0x20*ones)|x)&highs != 0 {
				break
			}
			s = s[8:]
		}
		if len(s) == 0 {
			return 0, OK
		}
		switch c := s[0]; {
		case c < 0x20:
			return n - len(s), Control
		case c < 0x80:
			s = s[1:]
		default:
			r, size := utf8.DecodeRune(s)
			if r == utf8.RuneError && size <= 1 {
				return n - len(s), BadUTF8
			}
			s = s[size:]
		}
	}
	return 0, OK
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

// AppendUnescaped appends the decoded bytes of s, the contents of a string ScanString or
// ScanStringLax accepted (without its quotes), to dst. A \u escape of a UTF-16 surrogate pair
// decodes to its code point; a lone surrogate decodes to U+FFFD, as encoding/json and the
// engines' tokenizers see it. Bytes that are not escapes are copied as they are. On bytes no
// scan accepted it stops at the first broken escape, without panicking.
func AppendUnescaped(dst, s []byte) []byte {
	for {
		j := bytes.IndexByte(s, '\\')
		if j < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:j]...)
		s = s[j:]
		if len(s) < 2 {
			return dst
		}
		switch c := s[1]; c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			if len(s) < 6 {
				return dst
			}
			r, ok := hex4(s[2:6])
			if !ok {
				return dst
			}
			s = s[6:]
			if utf16.IsSurrogate(r) && len(s) >= 6 && s[0] == '\\' && s[1] == 'u' {
				if lo, ok := hex4(s[2:6]); ok {
					if pair := utf16.DecodeRune(r, lo); pair != utf8.RuneError {
						r = pair
						s = s[6:]
					}
				}
			}
			dst = utf8.AppendRune(dst, r) // a lone surrogate appends U+FFFD
			continue
		default: // " \ /
			dst = append(dst, c)
		}
		s = s[2:]
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
