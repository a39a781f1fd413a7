// Package engine is kvgate's one vocabulary for the kinds of LLM server it routes to
// (vLLM, SGLang, TensorRT-LLM, llama.cpp): their names as flags and configs spell them,
// and which of them publish KV events. The proxy, ingest and hashcore all name engines
// with it, so a kind is spelled and parsed in one place.
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

// Publishes reports whether k publishes KV events kvgate can follow: vLLM and SGLang
// over ZeroMQ, TensorRT-LLM over its HTTP drain. llama.cpp publishes none.
func (k Kind) Publishes() bool { return k == VLLM || k == SGLang || k == TRTLLM }

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
