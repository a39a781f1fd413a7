package chat

import "testing"

// TestRenderAllocsBounded guards the per-render arena: a ~4,000-token Qwen3 conversation with
// tools renders with a small, fixed number of allocations (today 17: the strings the template
// builds with "+" in {% set %} and a few slices), not one per JSON value.
func TestRenderAllocsBounded(t *testing.T) {
	tmpl := mustCompile(t, loadChatTemplate(t, "qwen3"))
	in := benchConversation()
	out, err := tmpl.Render(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(50, func() {
		out, err = tmpl.Render(out[:0], in)
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("%.1f allocs per render of %d bytes", allocs, len(out))
	if allocs > 40 {
		t.Errorf("%.1f allocations per render, want <= 40", allocs)
	}
}
