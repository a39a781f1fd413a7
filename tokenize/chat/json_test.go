package chat

import (
	"encoding/json"
	"math/rand"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestJSONStringsRoundTrip checks the string scanner (including its 8-byte fast path) against
// encoding/json on random text with quotes, backslashes, controls and multi-byte runes at
// every alignment.
func TestJSONStringsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	alphabet := []rune{'a', 'b', ' ', '"', '\\', '\n', '\t', 0x01, 0x1f, 0x7f, 'é', '😀', 0x2028, '<', '/'}
	for n := 0; n < 3000; n++ {
		rs := make([]rune, rng.Intn(40))
		for i := range rs {
			rs[i] = alphabet[rng.Intn(len(alphabet))]
		}
		s := string(rs)
		enc, _ := json.Marshal(map[string]string{"k": s})
		for _, a := range []*arena{nil, {}} {
			v, err := parseJSONIn(a, enc)
			if err != nil {
				t.Fatalf("%q: %v", enc, err)
			}
			got, _ := v.dct().get("k")
			if got.s != s {
				t.Fatalf("%q: got %q want %q", enc, got.s, s)
			}
		}
	}
}

// TestJSONFaultOffsets pins where each lexical fault is reported (offsets worked out by
// hand from the input), for strings as values and as keys, with and without an arena.
func TestJSONFaultOffsets(t *testing.T) {
	for in, want := range map[string]string{
		`"abc`:           "offset 4: unterminated string",
		`"a\"`:           "offset 4: unterminated string",
		`"ab\q"`:         `offset 5: bad escape \q`,
		`"ab\u12"`:       `offset 5: bad \u escape`,
		"\"ab\x01\"":     "offset 3: control character in string",
		`["x", "\u12x"]`: `offset 9: bad \u escape`,
		`{"k\q":1}`:      `offset 5: bad escape \q`,
		`["` + strings.Repeat("y", 30) + `\"` + "\x1f" + `"]`: "offset 34: control character in string",
		`[1.]`:  "offset 3: bad number",
		`-`:     "offset 1: bad number",
		`[tru]`: "offset 1: invalid literal",
	} {
		for _, a := range []*arena{nil, {}} {
			_, err := parseJSONIn(a, []byte(in))
			if err == nil || err.Error() != "chat: invalid JSON at "+want {
				t.Errorf("%q: %v, want %s", in, err, want)
			}
		}
	}
}

func FuzzParseJSON(f *testing.F) {
	f.Add([]byte(`{"a":[1,2.5,-0,1e400,"x\u00e9\ud83d\ude00",null,true,{"b":{}}],"a":false}`))
	f.Add([]byte(`"\ud800"`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var ref any
		refErr := json.Unmarshal(data, &ref)
		v, err := parseJSONIn(&arena{}, data)
		// Python's json accepts NaN/Infinity and invalid UTF-8 passes through; otherwise a
		// document encoding/json accepts must parse, and vice versa.
		// Integers beyond 64 bits are refused on purpose (Python keeps them exact; we cannot).
		if refErr == nil && err != nil && !strings.Contains(err.Error(), "does not fit in 64 bits") {
			t.Fatalf("%q: encoding/json accepts, we reject: %v", data, err)
		}
		if err == nil && v.k == kString && utf8.ValidString(v.s) && refErr != nil && utf8.Valid(data) {
			var s string
			if json.Unmarshal(data, &s) == nil && s != v.s {
				t.Fatalf("%q: got %q want %q", data, v.s, s)
			}
		}
	})
}

// BenchmarkParseMessages parses the ~18 KB messages array of the render benchmark.
func BenchmarkParseMessages(b *testing.B) {
	in := benchConversation()
	var a arena
	b.SetBytes(int64(len(in.Messages)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseJSONIn(&a, in.Messages); err != nil {
			b.Fatal(err)
		}
		a.reset()
	}
}
