package tokenize

import "sync"

// Character classes used by the pre-tokenizer scanners, as bits of one uint16 per code point.
// The tables come from the regex engine inside HF tokenizers (see unicode_tables.go), so the
// scanners classify every code point exactly as the engine's \p{..} and \s do.
const (
	cL uint16 = 1 << iota
	cLu
	cLl
	cLt
	cLm
	cLo
	cM
	cN
	cP
	cS
	cSpace
	cCRLF // '\r' or '\n'
)

// classTable is a two-level lookup: stage1 maps the high bits of a code point to a block of
// 256 entries in stage2. Built once, on the first tokenizer load.
type classTable struct {
	stage1 [0x110000 >> 8]uint16
	stage2 []uint16
}

var (
	classesOnce sync.Once
	classes     *classTable
	asciiClass  [128]uint16
	lowerMap    map[rune]rune // one-character lowercase mappings (lowerSingle)
)

func loadClasses() {
	classesOnce.Do(func() {
		full := make([]uint16, 0x110000)
		for _, t := range []struct {
			bits   uint16
			ranges []uint32
		}{
			{cL, classL}, {cLu, classLu}, {cLl, classLl}, {cLt, classLt}, {cLm, classLm}, {cLo, classLo},
			{cM, classM}, {cN, classN}, {cP, classP}, {cS, classS}, {cSpace, classSpace},
		} {
			for i := 0; i+1 < len(t.ranges); i += 2 {
				for c := t.ranges[i]; c <= t.ranges[i+1]; c++ {
					full[c] |= t.bits
				}
			}
		}
		full['\r'] |= cCRLF
		full['\n'] |= cCRLF
		ct := &classTable{}
		seen := map[[256]uint16]uint16{}
		for b := 0; b < len(ct.stage1); b++ {
			var blk [256]uint16
			copy(blk[:], full[b<<8:(b+1)<<8])
			idx, ok := seen[blk]
			if !ok {
				idx = uint16(len(ct.stage2) >> 8)
				seen[blk] = idx
				ct.stage2 = append(ct.stage2, blk[:]...)
			}
			ct.stage1[b] = idx
		}
		classes = ct
		copy(asciiClass[:], full[:128])
		lowerMap = make(map[rune]rune, len(lowerSingle)/2)
		for i := 0; i+1 < len(lowerSingle); i += 2 {
			lowerMap[rune(lowerSingle[i])] = rune(lowerSingle[i+1])
		}
	})
}

// classOf returns the class bits of code point r (0 for invalid code points).
func classOf(r rune) uint16 {
	if uint32(r) < 128 {
		return asciiClass[r]
	}
	if uint32(r) >= 0x110000 {
		return 0
	}
	c := classes
	return c.stage2[int(c.stage1[r>>8])<<8|int(r&0xff)]
}
