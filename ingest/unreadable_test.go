package ingest

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// An engine whose messages kvgate cannot read at all (another wire format, a version it
// does not know) must not leave the inventory behind in silence: each message is
// counted, the first one WARNs at once, naming the endpoint and the decoder's error, the
// next ones within badEventWarnEvery add only to the count (the next WARN carries it), and
// readable batches around them still apply.
func TestUnreadableMessagesWarn(t *testing.T) {
	inv := newInv(t)
	logs := &recordingHandler{}
	cfg := testConfig(inv)
	cfg.Logger = slog.New(logs)
	pub := newPub(t, enginepub.Config{Endpoint: freeAddr(t, 1)})
	m := startManager(t, cfg, EndpointConfig{Name: "a", Index: 0, Engine: "vllm", Events: pub.Addr()})
	waitSubscribed(t, pub)

	pub.Publish(stored(1, 2))
	waitFor(t, "the first batch", func() bool { return inv.Count(0) == 2 })
	for _, p := range [][]byte{[]byte("not msgpack"), {0x93, 0xc1}, {}} {
		if err := pub.PublishRaw(p); err != nil {
			t.Fatal(err)
		}
	}
	pub.Publish(stored(3))
	waitFor(t, "the batch after the unreadable ones", func() bool { return inv.Count(0) == 3 })
	if n := m.Status(0).DecodeErrors; n != 3 {
		t.Fatalf("%d messages counted unreadable, want 3", n)
	}
	warns := logs.warns("event message is unreadable")
	if len(warns) != 1 || !strings.Contains(warns[0], "endpoint=a") || !strings.Contains(warns[0], "err=") ||
		!strings.Contains(warns[0], "unreadable_since_last_warn=1") {
		t.Fatalf("want one WARN naming the endpoint, the error and 1 message, got %q", warns)
	}

	// Past the interval the next one WARNs with the count since the last WARN.
	m.eps[0].lostWarned.Store(m.eps[0].lostWarned.Load() - int64(badEventWarnEvery))
	pub.PublishRaw([]byte("still not msgpack"))
	waitFor(t, "the second WARN", func() bool { return len(logs.warns("event message is unreadable")) == 2 })
	if w := logs.warns("event message is unreadable")[1]; !strings.Contains(w, "unreadable_since_last_warn=3") {
		t.Fatalf("second WARN %q, want the 3 messages since the first", w)
	}
}
