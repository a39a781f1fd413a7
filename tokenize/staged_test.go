package tokenize

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestStagedDir(t *testing.T) {
	dir, err := StagedDir("qwen3")
	if err != nil {
		t.Fatal(err) // make test fetches it first
	}
	if !filepath.IsAbs(dir) || !strings.HasSuffix(dir, filepath.Join("tokenizer-qwen3", "models")) {
		t.Errorf("dir %q", dir)
	}
	t.Setenv("KVGATE_CACHE", t.TempDir())
	if _, err := StagedDir("qwen3"); err == nil || !strings.Contains(err.Error(), "make fetch") {
		t.Errorf("empty cache: err %v, want one naming `make fetch`", err)
	}
}
