package chat

import "testing"

// TestRenderAllocsBounded guards the per-render scratch: a ~4,000-token conversation (with
// tools where the template takes them) renders with no allocation once the pooled renderer
// has warmed up: values, dicts, call arguments and the strings the template builds ("+",
// captured blocks, decoded JSON escapes) all come from the pooled arena.
func TestRenderAllocsBounded(t *testing.T) {
	base := benchConversation()
	for _, model := range []string{"qwen3", "deepseek_v3", "gemma3", "llama3_1"} {
		t.Run(model, func(t *testing.T) {
			tmpl := mustCompile(t, loadChatTemplate(t, model))
			in := benchInputFor(model, base)
			want, err := tmpl.Render(nil, &in)
			if err != nil {
				t.Fatal(err)
			}
			var out []byte
			allocs := testing.AllocsPerRun(50, func() {
				out, err = tmpl.Render(out[:0], &in)
				if err != nil {
					t.Fatal(err)
				}
			})
			if string(out) != string(want) {
				t.Fatalf("steady-state render differs from the first render")
			}
			t.Logf("%.1f allocs per render of %d bytes", allocs, len(out))
			// The race detector makes sync.Pool drop objects at random, so a render may start
			// from a cold renderer; only bound the average there.
			limit := 0.0
			if raceEnabled {
				limit = 40
			}
			if allocs > limit {
				t.Errorf("%.1f allocations per render, want <= %.0f", allocs, limit)
			}
		})
	}
}
