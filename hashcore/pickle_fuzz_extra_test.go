package hashcore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"
	"unicode/utf8"
)

// unpickle is a small protocol-5 reader for the opcodes a block pickle may hold: an
// oracle independent of the encoder's layout code (it checks frames, memo slots and
// values, not bytes). Values: []byte, string, nil, int64, []any (tuples).
func unpickle(b []byte) (any, error) {
	if len(b) < 2 || b[0] != pkProto || b[1] != 5 {
		return nil, errors.New("no PROTO 5")
	}
	i := 2
	var stack []any
	var marks []int
	var memo []any
	frameEnd := -1
	need := func(n int) error {
		if i+n > len(b) {
			return errors.New("truncated")
		}
		if frameEnd >= 0 && i+n > frameEnd {
			return errors.New("value crosses a frame end")
		}
		return nil
	}
	for {
		if i >= len(b) {
			return nil, errors.New("no STOP")
		}
		if frameEnd >= 0 && i == frameEnd {
			frameEnd = -1
		}
		op := b[i]
		i++
		switch op {
		case pkFrame:
			if frameEnd >= 0 {
				return nil, errors.New("FRAME inside a frame")
			}
			if i+8 > len(b) {
				return nil, errors.New("truncated FRAME")
			}
			n := int(binary.LittleEndian.Uint64(b[i:]))
			i += 8
			if n < pkFrameMinimum || i+n > len(b) {
				return nil, errors.New("bad frame length")
			}
			frameEnd = i + n
		case pkShortBinBytes, pkShortBinUnicod:
			if err := need(1); err != nil {
				return nil, err
			}
			n := int(b[i])
			i++
			if err := need(n); err != nil {
				return nil, err
			}
			if op == pkShortBinBytes {
				stack = append(stack, slices.Clone(b[i:i+n]))
			} else {
				stack = append(stack, string(b[i:i+n]))
			}
			i += n
		case pkBinBytes, pkBinUnicode:
			if err := need(4); err != nil {
				return nil, err
			}
			n := int(binary.LittleEndian.Uint32(b[i:]))
			i += 4
			if err := need(n); err != nil {
				return nil, err
			}
			if op == pkBinBytes {
				stack = append(stack, slices.Clone(b[i:i+n]))
			} else {
				stack = append(stack, string(b[i:i+n]))
			}
			i += n
		case pkMemoize:
			if len(stack) == 0 {
				return nil, errors.New("MEMOIZE on empty stack")
			}
			memo = append(memo, stack[len(stack)-1])
		case pkBinGet:
			if err := need(1); err != nil {
				return nil, err
			}
			if int(b[i]) >= len(memo) {
				return nil, errors.New("BINGET of an unset slot")
			}
			stack = append(stack, memo[b[i]])
			i++
		case pkBinInt1:
			if err := need(1); err != nil {
				return nil, err
			}
			stack = append(stack, int64(b[i]))
			i++
		case pkBinInt2:
			if err := need(2); err != nil {
				return nil, err
			}
			stack = append(stack, int64(binary.LittleEndian.Uint16(b[i:])))
			i += 2
		case pkBinInt:
			if err := need(4); err != nil {
				return nil, err
			}
			stack = append(stack, int64(int32(binary.LittleEndian.Uint32(b[i:]))))
			i += 4
		case pkLong1:
			if err := need(1); err != nil {
				return nil, err
			}
			n := int(b[i])
			i++
			if n > 8 || need(n) != nil {
				return nil, errors.New("bad LONG1")
			}
			var v [8]byte
			copy(v[:], b[i:i+n])
			if n > 0 && b[i+n-1]&0x80 != 0 {
				return nil, errors.New("negative LONG1")
			}
			stack = append(stack, int64(binary.LittleEndian.Uint64(v[:])))
			i += n
		case pkNone:
			stack = append(stack, nil)
		case pkMark:
			marks = append(marks, len(stack))
		case pkTuple1, pkTuple2, pkTuple3, pkTuple:
			var k int
			switch op {
			case pkTuple1, pkTuple2, pkTuple3:
				k = len(stack) - int(op-pkTuple1+1)
			default:
				if len(marks) == 0 {
					return nil, errors.New("TUPLE without MARK")
				}
				k = marks[len(marks)-1]
				marks = marks[:len(marks)-1]
			}
			if k < 0 {
				return nil, errors.New("tuple underflow")
			}
			tup := slices.Clone(stack[k:])
			stack = append(stack[:k], tup)
		case pkStop:
			if len(stack) != 1 || len(marks) != 0 || i != len(b) {
				return nil, errors.New("bad STOP")
			}
			if frameEnd >= 0 && frameEnd != i {
				return nil, errors.New("frame runs past STOP")
			}
			return stack[0], nil
		default:
			return nil, errors.New("unexpected opcode")
		}
	}
}

// FuzzBlockPickle: every block pickle reads back as (parent, tuple(tokens), extras) with
// valid framing and memo use, and the hot-path encoder writes the same bytes.
func FuzzBlockPickle(f *testing.F) {
	f.Add([]byte{1, 2, 3}, []byte{1, 0, 0, 0, 0, 1, 0, 0, 255, 255, 255, 255}, "", "", 1)
	f.Add(bytes.Repeat([]byte{9}, 32), []byte{23, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 128}, "lora", "lora", 1)
	f.Add(bytes.Repeat([]byte{7}, 300), []byte{5, 0, 0, 0}, "a", "a", 3000)
	f.Add([]byte{}, []byte{0xff, 0xff, 0xff, 0x7f}, string(make([]byte, 300)), "s", 20000)
	f.Fuzz(func(t *testing.T, parent, raw []byte, lora, salt string, repeat int) {
		if !utf8.ValidString(lora) || !utf8.ValidString(salt) {
			return // refused by ValidateExtras before encoding
		}
		var tokens []uint32
		for i := 0; i+4 <= len(raw); i += 4 {
			tokens = append(tokens, binary.LittleEndian.Uint32(raw[i:]))
		}
		if len(tokens) == 0 {
			return
		}
		// Long blocks exercise frame commits (64 KiB): repeat the tokens.
		if repeat = repeat % 20000; repeat > 1 && len(tokens)*repeat <= 40000 {
			base := tokens
			for r := 1; r < repeat; r++ {
				tokens = append(tokens, base...)
			}
		}
		var p pickler
		got := appendBlockPickle(&p, nil, parent, tokens, lora, salt)
		v, err := unpickle(got)
		if err != nil {
			t.Fatalf("block pickle does not read back: %v\n%x", err, got[:min(len(got), 200)])
		}
		top, ok := v.([]any)
		if !ok || len(top) != 3 {
			t.Fatalf("top value %T %v", v, v)
		}
		if pb, ok := top[0].([]byte); !ok || !bytes.Equal(pb, parent) {
			t.Fatalf("parent %v", top[0])
		}
		toks, ok := top[1].([]any)
		if !ok || len(toks) != len(tokens) {
			t.Fatalf("tokens: %T len %d, want %d", top[1], len(toks), len(tokens))
		}
		for i, tv := range toks {
			if tv != int64(tokens[i]) {
				t.Fatalf("token %d: %v want %d", i, tv, tokens[i])
			}
		}
		var wantEx []any
		if lora != "" {
			wantEx = append(wantEx, lora)
		}
		if salt != "" {
			wantEx = append(wantEx, salt)
		}
		if wantEx == nil {
			if top[2] != nil {
				t.Fatalf("extras %v, want None", top[2])
			}
		} else if ex, ok := top[2].([]any); !ok || !slices.Equal(ex, wantEx) {
			t.Fatalf("extras %v, want %v", top[2], wantEx)
		}
		// The hot-path layout writes the same bytes whenever it applies.
		if len(parent) <= 32 {
			d := Digest{N: uint8(len(parent))}
			copy(d.B[:], parent)
			suffix := appendPickleSuffix(nil, len(tokens), lora, salt)
			if pickleFits(int(d.N), len(tokens), len(suffix)) {
				// The encoder's own bound, and the chains' buffer with padding slack
				// (room for the AVX-512 token encoder's 64-byte stores, where present).
				for _, slack := range []int{0, sha256PadSlack} {
					fast := encodeBlockPickle(make([]byte, 0, pickleMaxLen(int(d.N), len(tokens), len(suffix))+slack), &d, tokens, suffix)
					if !bytes.Equal(fast, got) {
						t.Fatalf("fast pickle (slack %d) differs\n got %x\nwant %x", slack, fast, got)
					}
				}
			}
		}
		// The NONE_HASH seed string.
		s := lora + salt
		if sv, err := unpickle(appendStrPickle(&p, nil, s)); err != nil || sv != s {
			t.Fatalf("str pickle of %q reads %v (%v)", s, sv, err)
		}
	})
}
