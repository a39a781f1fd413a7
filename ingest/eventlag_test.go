package ingest

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// TestEventLagFromBatchStamp: a live batch's publish-to-applied time lands in
// kvgate_ingest_event_lag_seconds from the batch's own ts: one published now falls in a
// sub-second bucket, one stamped 2 s ago (a slow engine-side queue) in the (1, 2.5] bucket,
// and one stamped ahead of kvgate's clock counts as 0.
func TestEventLagFromBatchStamp(t *testing.T) {
	inv := newInv(t)
	set := metrics.NewSet()
	cfg := testConfig(inv)
	cfg.Metrics = set
	pub := newPub(t, enginepub.Config{Endpoint: freeAddr(t, 1)})
	startManager(t, cfg, EndpointConfig{Name: "a", Index: 0, Engine: "vllm", Events: pub.Addr()})
	waitSubscribed(t, pub)

	pub.Publish(stored(1, 2))
	waitFor(t, "the first batch", func() bool { return inv.Count(0) == 2 })
	var f enginepub.Format
	now := float64(time.Now().UnixNano()) / 1e9
	pub.PublishRaw(f.AppendBatch(nil, now-2, []enginepub.Event{stored(3)}))
	pub.PublishRaw(f.AppendBatch(nil, now+60, []enginepub.Event{stored(4)}))
	waitFor(t, "the stamped batches", func() bool { return inv.Count(0) == 4 })

	var out bytes.Buffer
	set.WritePrometheus(&out)
	text := out.String()
	for _, want := range []string{
		`kvgate_ingest_event_lag_seconds_bucket{le="0.5"} 2`,  // now, and the one from the future as 0
		`kvgate_ingest_event_lag_seconds_bucket{le="1"} 2`,    // nothing between 0.5 and 1 s
		`kvgate_ingest_event_lag_seconds_bucket{le="2.5"} 3`,  // the one stamped 2 s ago
		`kvgate_ingest_event_lag_seconds_bucket{le="+Inf"} 3`, // three live batches
		`kvgate_ingest_event_lag_seconds_count 3`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("want %s in:\n%s", want, grepLines(text, "event_lag"))
		}
	}
}

func grepLines(text, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
