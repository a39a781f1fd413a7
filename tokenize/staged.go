package tokenize

import "github.com/kvgate/kvgate/internal/testfix"

// StagedDir is where `make fetch` stages the tokenizer package NAME (qwen3, llama3, gpt4o,
// deepseek_v3, gemma3, llama2, llama3_1): $KVGATE_CACHE, else the .cache folder of the
// repository enclosing the working directory (found by walking up to go.mod), else
// ./.cache. The path is absolute and always returned; err says it holds no tokenizer.json,
// naming the command that stages it.
func StagedDir(name string) (string, error) { return testfix.StagedDir(name) }
