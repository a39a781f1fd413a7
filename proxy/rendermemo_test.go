package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// A follow-up turn's explanation says how much of the template render came from the render
// memo, the token count is what a rule without the memo computes, and /metrics carries the
// memo's series.
func TestRenderMemoExplainAndMetrics(t *testing.T) {
	a := newKVEngine(t, "a", enginepub.VLLM)
	on := startProxy(t, kvConfig(t, KVConverged, a.spec(0, "vllm", "")))
	offCfg := kvConfig(t, KVConverged, a.spec(0, "vllm", ""))
	offCfg.Models.RenderMemoBytes = 0
	off := startProxy(t, offCfg)
	var msgs []string
	for turn := 0; turn < 4; turn++ {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"question %d about routing"}`, turn))
		body := `{"model":"qwen3","messages":[` + strings.Join(msgs, ",") + `]}`
		ex, base := explainBody(t, on, body), explainBody(t, off, body)
		if ex.Tokens == 0 || ex.Tokens != base.Tokens {
			t.Fatalf("turn %d: %d tokens with the render memo, %d without", turn, ex.Tokens, base.Tokens)
		}
		// Every message but the new one and the previous answer was in an earlier request.
		if seen := max(0, 2*turn-1); ex.Memo == nil || ex.Memo.Messages != len(msgs) || ex.Memo.Bound != seen {
			t.Fatalf("turn %d: memo %+v, want %d messages, %d of them from the memo", turn, ex.Memo, len(msgs), seen)
		}
		if turn > 0 && ex.Memo.Replayed == 0 {
			t.Fatalf("turn %d: nothing replayed (%+v)", turn, ex.Memo)
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":"answer %d"}`, turn))
	}
	got := scrapeMetrics(t, on)
	if got["kvgate_render_memo_hits_total"] == 0 || got["kvgate_render_memo_misses_total"] == 0 || got["kvgate_render_memo_bytes"] <= 0 {
		t.Errorf("render memo series: hits %v, misses %v, bytes %v", got["kvgate_render_memo_hits_total"],
			got["kvgate_render_memo_misses_total"], got["kvgate_render_memo_bytes"])
	}
	if _, ok := scrapeMetrics(t, off)["kvgate_render_memo_hits_total"]; ok {
		t.Error("a rule with the render memo off exports its series")
	}
}
