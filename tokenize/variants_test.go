package tokenize

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvgate/kvgate/internal/testfix"
)

type variantSpec struct {
	Name        string                     `json:"name"`
	Base        string                     `json:"base"`
	Set         map[string]json.RawMessage `json:"set"`
	Model       map[string]json.RawMessage `json:"model"`
	AddedTokens map[string]map[string]any  `json:"added_tokens"`
}

type variantGoldens struct {
	Stride   int `json:"stride"`
	Docs     int `json:"docs"`
	Variants map[string]struct {
		Plain       [][2]any   `json:"plain"`
		Special     [][2]any   `json:"special"`
		FullPlain   [][]uint32 `json:"full_plain"`
		FullSpecial [][]uint32 `json:"full_special"`
	} `json:"variants"`
}

// applyVariant edits a tokenizer.json as tools/gen-tok-variants.js does.
func applyVariant(t *testing.T, base []byte, v variantSpec) []byte {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(base, &cfg); err != nil {
		t.Fatal(err)
	}
	for k, val := range v.Set {
		cfg[k] = val
	}
	if len(v.Model) > 0 {
		var model map[string]json.RawMessage
		if err := json.Unmarshal(cfg["model"], &model); err != nil {
			t.Fatal(err)
		}
		for k, val := range v.Model {
			model[k] = val
		}
		cfg["model"], _ = json.Marshal(model)
	}
	if len(v.AddedTokens) > 0 {
		var added []map[string]any
		if err := json.Unmarshal(cfg["added_tokens"], &added); err != nil {
			t.Fatal(err)
		}
		for _, a := range added {
			for k, val := range v.AddedTokens[a["content"].(string)] {
				a[k] = val
			}
		}
		cfg["added_tokens"], _ = json.Marshal(added)
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestVariantGoldens checks tokenizer.json variants (testdata/tokenize/variants.json) that use
// the components the six real files do not, against the HF library (tools/gen-tok-variants.js).
func TestVariantGoldens(t *testing.T) {
	root := testfix.RepoRoot(t)
	specData, err := os.ReadFile(filepath.Join(root, "testdata", "tokenize", "variants.json"))
	if err != nil {
		t.Fatal(err)
	}
	var specs []variantSpec
	if err := json.Unmarshal(specData, &specs); err != nil {
		t.Fatal(err)
	}
	var g variantGoldens
	if err := json.Unmarshal(readGz(t, filepath.Join(root, "testdata", "tokenize", "variants.golden.json.gz")), &g); err != nil {
		t.Fatal(err)
	}
	var docs []string
	for i, d := range loadCorpus(t) {
		if i%g.Stride == 0 {
			docs = append(docs, d)
		}
	}
	if len(docs) != g.Docs {
		t.Fatalf("variant goldens cover %d docs, corpus gives %d: regenerate with tools/goldens.sh", g.Docs, len(docs))
	}
	bases := map[string][]byte{}
	for _, v := range specs {
		t.Run(v.Name, func(t *testing.T) {
			want, ok := g.Variants[v.Name]
			if !ok {
				t.Fatalf("no goldens for variant %s: regenerate with tools/goldens.sh", v.Name)
			}
			if bases[v.Base] == nil {
				b, err := os.ReadFile(filepath.Join(testfix.TokenizerDir(t, v.Base), "tokenizer.json"))
				if err != nil {
					t.Fatal(err)
				}
				bases[v.Base] = b
			}
			tk, err := parseTokenizer(applyVariant(t, bases[v.Base], v))
			if err != nil {
				t.Fatal(err)
			}
			var ids []uint32
			failures := 0
			for _, special := range []bool{false, true} {
				w, full := want.Plain, want.FullPlain
				if special {
					w, full = want.Special, want.FullSpecial
				}
				for i, doc := range docs {
					ids, _ = tk.Encode(ids, doc, special)
					if len(ids) == int(w[i][0].(float64)) && idsHash(ids) == w[i][1].(string) {
						continue
					}
					failures++
					if failures <= 5 {
						msg := ""
						if i < len(full) {
							msg = firstDiff(ids, full[i])
						}
						d := doc
						if len(d) > 160 {
							d = d[:160] + "..."
						}
						t.Errorf("doc %d special=%v: got %d tokens, want %v%s\n  doc: %q", i*g.Stride, special, len(ids), w[i][0], msg, d)
					}
				}
			}
			if failures > 0 {
				t.Errorf("%d of %d encodings differ", failures, 2*len(docs))
			}
		})
	}
}
