package chat

import "testing"

// reasoning_effort implies enable_thinking (effort != "none") unless chat_template_kwargs
// name enable_thinking, as vLLM's build_chat_params; a null chat_template kwarg is the
// model's own template.
func TestReasoningEffortImpliesThinking(t *testing.T) {
	tmpl := mustCompile(t, `[{{ reasoning_effort }}|{{ enable_thinking }}]`)
	for _, c := range []struct{ effort, kwargs, want string }{
		{"none", "", "[none|False]"},
		{"low", "", "[low|True]"},
		{"max", `{"enable_thinking": false}`, "[max|False]"},
		{"none", `{"enable_thinking": null}`, "[none|None]"},
		{"", `{"enable_thinking": true, "reasoning_effort": "high"}`, "[high|True]"},
		{"", "", "[|]"},
		{"high", `{"chat_template": null}`, "[high|True]"},
	} {
		in := &Input{Messages: []byte(`[]`), ReasoningEffort: c.effort}
		if c.kwargs != "" {
			in.Kwargs = []byte(c.kwargs)
		}
		out, err := tmpl.Render(nil, in)
		if err != nil || string(out) != c.want {
			t.Errorf("effort=%q kwargs=%s: got %q, %v; want %q", c.effort, c.kwargs, out, err, c.want)
		}
	}
	if _, err := tmpl.Render(nil, &Input{Messages: []byte(`[]`), Kwargs: []byte(`{"chat_template": "x"}`)}); err == nil {
		t.Error("a chat_template kwarg must be refused")
	}
}
