package engine

import (
	"strings"
	"testing"
)

// TestParse: every spelling an operator writes maps to one kind, anything else is refused
// with a message listing the kinds.
func TestParse(t *testing.T) {
	for in, want := range map[string]Kind{
		"vllm": VLLM, "sglang": SGLang, "trtllm": TRTLLM, "tensorrt-llm": TRTLLM,
		"trt-llm": TRTLLM, "llamacpp": LlamaCpp, "llama.cpp": LlamaCpp,
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "VLLM", "tgi", "vllm "} {
		if k, err := Parse(in); err == nil || !strings.Contains(err.Error(), "want vllm, sglang, trtllm or llamacpp") {
			t.Errorf("Parse(%q) = %q, %v; want an error listing the kinds", in, k, err)
		}
	}
}
