package chat

import "testing"

// Plain user/assistant messages take a shortcut in preprocessing (the parsed dict kept, or
// rebuilt directly); what the template sees must be what the general path builds: role
// first, then content, then vLLM's extra keys, whatever the request's key order.
func TestPlainMessagesShortcut(t *testing.T) {
	tmpl := mustCompile(t, `{% for m in messages %}{{ m | tojson }};{% endfor %}`)
	cases := []struct{ messages, want string }{
		{`[{"role":"user","content":"hi"}]`, `{"role": "user", "content": "hi"};`},
		{`[{"content":"hi","role":"user"}]`, `{"role": "user", "content": "hi"};`},
		{`[{"content":"a","role":"assistant","content":"b"}]`, `{"role": "assistant", "content": "b"};`},
		{`[{"role":"assistant","content":"x","reasoning_content":"r"}]`, `{"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"};`},
		{`[{"content":"s","role":"system"}]`, `{"role": "system", "content": "s"};`},
		{`[{"role":"tool","content":"t"}]`, `{"role": "tool", "content": "t"};`},
		{`[{"role":"user","content":null}]`, `{"role": "user", "content": ""};`},
	}
	for _, c := range cases {
		out, err := tmpl.Render(nil, &Input{Messages: []byte(c.messages)})
		if err != nil {
			t.Fatalf("%s: %v", c.messages, err)
		}
		if string(out) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.messages, out, c.want)
		}
	}
}
