// Package engine is kvgate's one vocabulary for the kinds of LLM server it routes to
// (vLLM, SGLang, TensorRT-LLM, llama.cpp) and their names as flags and configs spell
// them. The proxy, ingest and hashcore all name engines with it, so a kind is spelled
// and parsed in one place.
package engine

import "fmt"

// Kind is the kind of server behind an endpoint. Its value is the canonical name, so a
// Kind prints, logs and marshals as that name and untyped string constants convert.
type Kind string

// The engine kinds kvgate knows. Other spellings parse to these (see Parse).
const (
	VLLM     Kind = "vllm"
	SGLang   Kind = "sglang"
	TRTLLM   Kind = "trtllm"
	LlamaCpp Kind = "llamacpp"
)

// String returns k's canonical name.
func (k Kind) String() string { return string(k) }

// Parse returns the kind named by s: a canonical name or the alias tensorrt-llm,
// trt-llm (TensorRT-LLM) or llama.cpp.
func Parse(s string) (Kind, error) {
	switch s {
	case "vllm":
		return VLLM, nil
	case "sglang":
		return SGLang, nil
	case "trtllm", "tensorrt-llm", "trt-llm":
		return TRTLLM, nil
	case "llamacpp", "llama.cpp":
		return LlamaCpp, nil
	}
	return "", fmt.Errorf("engine %q: want vllm, sglang, trtllm or llamacpp", s)
}
