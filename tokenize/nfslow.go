package tokenize

import (
	"slices"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Go's norm package follows the Stream-Safe Text Format: after 30 non-starters it inserts
// U+034F COMBINING GRAPHEME JOINER. HF tokenizers (Rust unicode-normalization) normalizes the
// whole run instead. Text with such a run takes this slow path: full decomposition, canonical
// ordering of each non-starter run, then (for NFC/NFKC) canonical composition.

func cccOf(r rune) uint8 {
	var b [4]byte
	n := utf8.EncodeRune(b[:], r)
	return norm.NFD.Properties(b[:n]).CCC()
}

// normalizeSlow appends the normalization of s in form f (without stream-safe breaks) to dst.
func normalizeSlow(dst []byte, s string, f norm.Form) []byte {
	decomp := norm.NFD
	if f == norm.NFKC || f == norm.NFKD {
		decomp = norm.NFKD
	}
	// 1. Full decomposition, rune by rune (decomposition is context-free).
	var rs []rune
	var b [4]byte
	for _, r := range s {
		n := utf8.EncodeRune(b[:], r)
		for _, d := range decomp.String(string(b[:n])) {
			rs = append(rs, d)
		}
	}
	// 2. Canonical ordering: stable sort of each run of non-starters by combining class.
	cccs := make([]uint8, len(rs))
	for i, r := range rs {
		cccs[i] = cccOf(r)
	}
	for i := 0; i < len(rs); {
		if cccs[i] == 0 {
			i++
			continue
		}
		j := i
		for j < len(rs) && cccs[j] != 0 {
			j++
		}
		idx := make([]int, j-i)
		for k := range idx {
			idx[k] = i + k
		}
		slices.SortStableFunc(idx, func(a, b int) int { return int(cccs[a]) - int(cccs[b]) })
		seg := make([]rune, len(idx))
		segc := make([]uint8, len(idx))
		for k, x := range idx {
			seg[k], segc[k] = rs[x], cccs[x]
		}
		copy(rs[i:j], seg)
		copy(cccs[i:j], segc)
		i = j
	}
	// 3. Canonical composition.
	if f == norm.NFC || f == norm.NFKC {
		out := rs[:0]
		outc := cccs[:0]
		starter := -1
		for i, r := range rs {
			c := cccs[i]
			if starter >= 0 {
				last := outc[len(outc)-1]
				blocked := len(out)-1 != starter && (last == 0 || last >= c)
				if !blocked {
					if comp, ok := composePair(out[starter], r); ok {
						out[starter] = comp
						continue
					}
				}
			}
			if c == 0 {
				starter = len(out)
			}
			out = append(out, r)
			outc = append(outc, c)
		}
		rs = out
	}
	for _, r := range rs {
		dst = utf8.AppendRune(dst, r)
	}
	return dst
}

// composePair returns the primary composite of a and b, if any (NFC of the pair is one rune).
func composePair(a, b rune) (rune, bool) {
	var buf [8]byte
	n := utf8.EncodeRune(buf[:], a)
	n += utf8.EncodeRune(buf[n:], b)
	c := norm.NFC.String(string(buf[:n]))
	r, size := utf8.DecodeRuneInString(c)
	if size == len(c) && r != a {
		return r, true
	}
	return 0, false
}
