package jsonlex

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestScanString(t *testing.T) {
	for _, avx2 := range []bool{false, usePlainAVX2} { // the portable walk, then this CPU's
		testScanString(t, avx2)
	}
}

func testScanString(t *testing.T, avx2 bool) {
	defer func(old bool) { usePlainAVX2 = old }(usePlainAVX2)
	usePlainAVX2 = avx2
	for _, c := range []struct {
		in      string
		end     int // the fault's offset when err != OK
		esc     bool
		err     Err
		laxSame bool // AppendStringLax gives the same answer
	}{
		{`""`, 2, false, OK, true},
		{`"abc" x`, 5, false, OK, true},
		{`"a\"b"`, 6, true, OK, true},
		{`"\\"`, 4, true, OK, true},
		{`"\/\b\f\n\r\t"`, 14, true, OK, true},
		{`"\u00e9\uD83D\uDE00"`, 20, true, OK, true},
		{`"` + strings.Repeat("long plain text ", 8) + `"`, 130, false, OK, true},
		{`"` + strings.Repeat("x", 40) + `\"` + strings.Repeat("y", 40) + `"`, 84, true, OK, true},
		{"\"é😀\"", 8, false, OK, true},
		{`"abc`, 4, false, Unterminated, true},
		{`"a\"`, 4, false, Unterminated, true},
		{`"\`, 2, false, Unterminated, true},
		{`"ab\q"`, 3, false, BadEscape, true},
		{`"ab\u12"`, 3, false, BadHex, true},
		{`"ab\u12g4"`, 3, false, BadHex, true},
		{"\"abc\x01\"", 4, false, Control, true},
		{"\"" + strings.Repeat("z", 37) + "\x1f\"", 38, false, Control, true},
		{"\"ab\xff\"", 3, false, BadUTF8, false},
		{"\"" + strings.Repeat("z", 20) + "\xed\xa0\x80\"", 21, false, BadUTF8, false}, // an encoded surrogate
		{"\"" + strings.Repeat("z", 70) + "\x01", 72, false, Unterminated, true},       // no quote after the fault
		{"\"" + strings.Repeat("z", 70) + "é\\\"" + strings.Repeat("é", 20) + "\"", 116, true, OK, true},
		{"\"" + strings.Repeat("z", 33) + "\x7f\"", 36, false, OK, true},
	} {
		b := []byte(c.in)
		end, esc, err := ScanString(b, 0)
		if end != c.end || esc != c.esc || err != c.err {
			t.Errorf("ScanString(%q) = %d, %v, %v; want %d, %v, %v", c.in, end, esc, err, c.end, c.esc, c.err)
		}
		_, lend, lesc, lerr := appendStringLax(nil, b, 0)
		if c.laxSame && (lend != end || lesc != esc || lerr != err) {
			t.Errorf("appendStringLax(%q) = %d, %v, %v; ScanString %d, %v, %v", c.in, lend, lesc, lerr, end, esc, err)
		}
		if !c.laxSame && (lerr != OK || lend != len(b)) {
			t.Errorf("appendStringLax(%q) = %d, %v; want the whole string", c.in, lend, lerr)
		}
	}
}

// appendStringLax is what tokenize/chat does with a string: ScanPlainLax, then
// AppendEscapedLax when it holds escapes.
func appendStringLax(dst, b []byte, i int) ([]byte, int, bool, Err) {
	end, esc, err := ScanPlainLax(b, i)
	if err != OK || !esc {
		return dst, end, false, err
	}
	dst, end, err = AppendEscapedLax(dst, b, i+1, end)
	if err != OK {
		return dst, end, false, err
	}
	return dst, end, true, OK
}

func TestScanNumber(t *testing.T) {
	for _, c := range []struct {
		in    string
		end   int
		isInt bool
		err   Err
	}{
		{`0`, 1, true, OK}, {`-0`, 2, true, OK}, {`123,`, 3, true, OK}, {`-45]`, 3, true, OK},
		{`1.5`, 3, false, OK}, {`1e9`, 3, false, OK}, {`-2.5E-3 `, 7, false, OK}, {`1e+0`, 4, false, OK},
		{`01`, 1, true, OK}, // the number is 0; what follows is the caller's to refuse
		{`-`, 1, false, BadNumber}, {`-x`, 1, false, BadNumber}, {`1.`, 2, false, BadNumber},
		{`1.e5`, 2, false, BadNumber}, {`1e`, 2, false, BadNumber}, {`1e+`, 3, false, BadNumber},
		{`.5`, 0, false, BadNumber}, {``, 0, false, BadNumber},
	} {
		end, isInt, err := ScanNumber([]byte(c.in), 0)
		if end != c.end || isInt != c.isInt || err != c.err {
			t.Errorf("ScanNumber(%q) = %d, %v, %v; want %d, %v, %v", c.in, end, isInt, err, c.end, c.isInt, c.err)
		}
	}
}

func TestLiteralAndWS(t *testing.T) {
	b := []byte(" \t\r\n true fals")
	i := SkipWS(b, 0)
	if i != 5 {
		t.Fatalf("SkipWS = %d", i)
	}
	if end, err := Literal(b, i, "true"); end != 9 || err != OK {
		t.Errorf("Literal true = %d, %v", end, err)
	}
	if end, err := Literal(b, 10, "false"); end != 10 || err != BadLiteral {
		t.Errorf("Literal of a cut word = %d, %v", end, err)
	}
	if SkipWS(b, len(b)) != len(b) || SkipWS([]byte("\v"), 0) != 0 {
		t.Error("SkipWS past the end or over a non-JSON space")
	}
}

// TestAppendUnescapedRandom decodes random strings, encoded by encoding/json and by hand
// (surrogate pairs, lone surrogates, escapes of every kind), and compares with
// json.Unmarshal, at every alignment of the fast paths.
func TestAppendUnescapedRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	pieces := []string{"a", "bcdefgh", " ", `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u00e9`, `\u00E9`,
		`\ud83d\ude00`, `\uD83D\uDE00`, `\ud800`, `\udc00`, `\ud800\u0041`, `\udbff\udfff`, "é", "😀", "\u2028",
		strings.Repeat("plain text ", 3)}
	var dst []byte
	for n := 0; n < 20000; n++ {
		var sb strings.Builder
		sb.WriteByte('"')
		for k := rng.Intn(12); k > 0; k-- {
			sb.WriteString(pieces[rng.Intn(len(pieces))])
		}
		sb.WriteByte('"')
		b := []byte(sb.String())
		end, _, err := ScanString(b, 0)
		if err != OK || end != len(b) {
			t.Fatalf("%q: ScanString %d %v", b, end, err)
		}
		var want string
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		dst = AppendUnescaped(append(dst[:0], "keep"...), b[1:end-1])
		if string(dst) != "keep"+want {
			t.Fatalf("%q: got %q want %q", b, dst[4:], want)
		}
		dst, lend, esc, lerr := appendStringLax(append(dst[:0], "keep"...), b, 0)
		if !esc {
			dst = append(dst, b[1:lend-1]...)
		}
		if lerr != OK || lend != end || string(dst) != "keep"+want {
			t.Fatalf("%q: AppendStringLax %d %v %q want %q", b, lend, lerr, dst, "keep"+want)
		}
	}
}

func TestAppendUnescapedBroken(t *testing.T) {
	// Bytes no scan accepted: no panic, a stop at the broken escape.
	for in, want := range map[string]string{`ab\`: "ab", `ab\u12`: "ab", `ab\uxyz1cd`: "ab", `a\qb`: "a"} {
		if got := string(AppendUnescaped(nil, []byte(in))); got != want {
			t.Errorf("AppendUnescaped(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestZeroAllocs(t *testing.T) {
	long := []byte(`"` + strings.Repeat(`a long prompt with \"escapes\", é and \ud83d\ude00 `, 40) + `"`)
	num := []byte(`-12.5e+3`)
	dst := make([]byte, 0, len(long))
	n := testing.AllocsPerRun(100, func() {
		end, _, err := ScanString(long, 0)
		if err != OK {
			t.Fatal(err)
		}
		var err2 Err
		if dst, _, _, err2 = appendStringLax(dst[:0], long, 0); err2 != OK {
			t.Fatal(err2)
		}
		if _, _, err := ScanNumber(num, 0); err != OK {
			t.Fatal(err)
		}
		if _, err := Literal([]byte("null"), 0, "null"); err != OK {
			t.Fatal(err)
		}
		dst = AppendUnescaped(dst[:0], long[1:end-1])
		_ = SkipWS(long, 0)
	})
	if n != 0 {
		t.Errorf("the core allocates %v per run", n)
	}
}

// FuzzLex holds the core to encoding/json on documents of one scalar token (a string, a
// number, a literal) with whitespace around: the core accepts the token and only whitespace
// follows exactly when json.Valid (plus utf8.Valid for ScanString: json.Valid does not check
// UTF-8); accepted strings decode to json.Unmarshal's bytes.
func FuzzLex(f *testing.F) {
	for _, s := range []string{`"a\"b\u00e9\ud83d\ude00\ud800x"`, ` "\q" `, "\"\x01\"", "\"\xff\"", `"` + strings.Repeat("x", 40) + `\"`,
		`-0.5e+7`, `01`, `1.`, ` true `, `nul`, `false`, "\t\n", `"\u12"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := plainEnd(data), plainEndNaive(data); got != want || plainEndSWAR(data) != want {
			t.Fatalf("%q: plainEnd %d, SWAR %d, want %d", data, got, plainEndSWAR(data), want)
		}
		// Whitespace: `""` followed by data is one JSON value exactly when data is all space.
		allWS := SkipWS(data, 0) == len(data)
		if ref := json.Valid(append([]byte(`""`), data...)); ref != allWS {
			t.Fatalf("%q: SkipWS all=%v, json.Valid=%v", data, allWS, ref)
		}
		i := SkipWS(data, 0)
		if i >= len(data) {
			return
		}
		valid := json.Valid(data)
		var end int
		var err Err
		switch c := data[i]; {
		case c == '"':
			var esc bool
			end, esc, err = ScanString(data, i)
			checkFault(t, data, i, end, err)
			ok := err == OK && SkipWS(data, end) == len(data)
			if ref := valid && utf8.Valid(data); ok != ref {
				t.Fatalf("%q: ScanString %d %v, json.Valid&&utf8.Valid=%v", data, end, err, ref)
			}
			decoded, lend, lesc, lerr := appendStringLax(nil, data, i)
			checkFault(t, data, i, lend, lerr)
			if lok := lerr == OK && SkipWS(data, lend) == len(data); lok != valid {
				t.Fatalf("%q: AppendStringLax %d %v, json.Valid=%v", data, lend, lerr, valid)
			}
			if err == OK && (lend != end || lesc != esc) {
				t.Fatalf("%q: strict %d %v, lax %d %v", data, end, esc, lend, lesc)
			}
			if lerr != OK {
				return
			}
			if !lesc && bytes.IndexByte(data[i:lend], '\\') >= 0 {
				t.Fatalf("%q: escapes not reported", data)
			}
			if lok := SkipWS(data, lend) == len(data); lok && utf8.Valid(data) {
				var want string
				if err := json.Unmarshal(data, &want); err != nil {
					t.Fatalf("%q: %v", data, err)
				}
				if got := AppendUnescaped(nil, data[i+1:lend-1]); string(got) != want {
					t.Fatalf("%q: unescaped %q, json.Unmarshal %q", data, got, want)
				}
				if !lesc {
					decoded = data[i+1 : lend-1]
				}
				if string(decoded) != want {
					t.Fatalf("%q: AppendStringLax decoded %q, json.Unmarshal %q", data, decoded, want)
				}
			}
			return
		case c == '-' || c >= '0' && c <= '9':
			var isInt bool
			end, isInt, err = ScanNumber(data, i)
			if err == OK && isInt == bytes.ContainsAny(data[i:end], ".eE") {
				t.Fatalf("%q: isInt=%v", data, isInt)
			}
		case c == 't':
			end, err = Literal(data, i, "true")
		case c == 'f':
			end, err = Literal(data, i, "false")
		case c == 'n':
			end, err = Literal(data, i, "null")
		default:
			return // containers are the readers' (their fuzz targets hold them to encoding/json)
		}
		checkFault(t, data, i, end, err)
		if ok := err == OK && SkipWS(data, end) == len(data); ok != valid {
			t.Fatalf("%q: end %d %v, json.Valid=%v", data, end, err, valid)
		}
	})
}

// checkFault checks the offset contract: within the input, and on the byte the kind names.
func checkFault(t *testing.T, data []byte, start, end int, err Err) {
	t.Helper()
	if end < start || end > len(data) {
		t.Fatalf("%q: end %d outside [%d, %d]", data, end, start, len(data))
	}
	ok := true
	switch err {
	case Unterminated:
		ok = end == len(data)
	case BadEscape, BadHex:
		ok = data[end] == '\\'
	case Control:
		ok = data[end] < 0x20
	case BadUTF8:
		ok = data[end] >= 0x80
	}
	if !ok {
		t.Fatalf("%q: %v at %d", data, err, end)
	}
}

// BenchmarkScanLongString scans and decodes a ~20 KB prompt string with a few escapes.
func BenchmarkScanLongString(b *testing.B) {
	s := []byte(`"` + strings.Repeat("How does the prefix cache decide which blocks to keep when memory is tight?\n", 250) + `"`)
	s = bytes.ReplaceAll(s, []byte("\n"), []byte(`\n`))
	dst := make([]byte, 0, len(s))
	b.SetBytes(int64(len(s)))
	b.ReportAllocs()
	for b.Loop() {
		end, _, err := ScanString(s, 0)
		if err != OK {
			b.Fatal(err)
		}
		dst = AppendUnescaped(dst[:0], s[1:end-1])
	}
}

// plainEndNaive is plainEnd's definition, a byte at a time.
func plainEndNaive(s []byte) int {
	for i, c := range s {
		if c == '"' || c == '\\' || c < 0x20 || c >= 0x80 {
			return i
		}
	}
	return len(s)
}

// TestPlainEnd: the vector and word-at-a-time searches find the first byte that is not
// plain ASCII wherever it lies (every offset of every 32-byte step, the overlapping last
// step, short inputs) and which byte it is.
func TestPlainEnd(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	specials := []byte{'"', '\\', 0x00, 0x1f, 0x80, 0xff, 0xc3}
	for n := 0; n <= 130; n++ {
		for trial := 0; trial < 40; trial++ {
			s := make([]byte, n)
			for i := range s {
				s[i] = byte(0x20 + rng.Intn(0x5f)) // plain ASCII, but the two below
				if s[i] == '"' || s[i] == '\\' {
					s[i] = 'a'
				}
			}
			if n > 0 && trial > 0 {
				s[rng.Intn(n)] = specials[rng.Intn(len(specials))]
				if trial%3 == 0 {
					s[rng.Intn(n)] = specials[rng.Intn(len(specials))]
				}
			}
			want := plainEndNaive(s)
			if got := plainEndSWAR(s); got != want {
				t.Fatalf("SWAR %q: %d, want %d", s, got, want)
			}
			if usePlainAVX2 {
				if got := plainEnd(s); got != want {
					t.Fatalf("AVX2 %q: %d, want %d", s, got, want)
				}
			}
		}
	}
}

func BenchmarkPlainEnd(b *testing.B) {
	s := bytes.Repeat([]byte("plain prompt text, mostly ASCII. "), 1000)
	for _, c := range []struct {
		name string
		f    func([]byte) int
	}{{"swar", plainEndSWAR}, {"this-cpu", plainEnd}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				if c.f(s) != len(s) {
					b.Fatal("stopped early")
				}
			}
		})
	}
}
