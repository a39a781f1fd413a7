//go:build !race

package proxy

import (
	"testing"

	"github.com/kvgate/kvgate/proxy/openai"
)

// The request-field paths add no allocation to routing: a chat body with documents,
// reasoning_effort and add_special_tokens, a Responses body and a batch prompt route with
// the allocations of a plain chat (the template renderer's own, zero for Qwen3).
func TestFieldsRoutingAllocs(t *testing.T) {
	_, templates := fieldGoldens(t)
	s, _ := fieldProxy(t, templates)
	allocs := func(body string) float64 {
		st := s.getState()
		defer s.putState(st)
		st.body = append(st.body[:0], body...)
		route := func() {
			if err := openai.Scan(st.body, &st.oa); err != nil {
				t.Fatal(err)
			}
			st.chat = !st.oa.Value[openai.FPrompt].Present()
			var d decision
			s.kv.route(st, s.baseEligible(st, st.eligible, nil), &d)
			if d.route.IsMiss() && d.route != RouteMissNoWorker {
				t.Fatalf("%.50s: %v", body, d.route)
			}
		}
		route()
		return testing.AllocsPerRun(50, route)
	}
	text := `"hello there, this is a prompt long enough to fill a few blocks of sixteen tokens each"`
	base := allocs(`{"model":"qwen3","messages":[{"role":"user","content":` + text + `}]}`)
	for _, body := range []string{
		`{"model":"local_rag","messages":[{"role":"user","content":` + text + `}],"documents":[{"title":"t","text":"x"}],"reasoning_effort":"low","add_special_tokens":true,"truncate_prompt_tokens":4096}`,
		`{"model":"qwen3","input":[{"role":"user","content":[{"type":"input_text","text":` + text + `}]},{"role":"assistant","content":[{"type":"output_text","text":"ok"}]},{"role":"user","content":"more"}],"instructions":"be brief","reasoning":{"effort":"low"}}`,
		`{"model":"qwen3","prompt":[` + text + `,"b","c"],"add_special_tokens":false}`,
		`{"model":"qwen3","prompt":[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],[1]]}`,
	} {
		if n := allocs(body); n > base {
			t.Errorf("%.60s: %v allocs per request, plain chat %v", body, n, base)
		}
	}
}
