package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvgate/kvgate/bench/enginepub"
	"github.com/kvgate/kvgate/internal/natstest"
)

// TestPlaneIngestNoStreamDegraded: an ingest replica connected to a nats-server on which
// it cannot create the event stream (another stream already owns its subjects) publishes
// nothing; /debug/inventory and /metrics must say so, not "publishing".
func TestPlaneIngestNoStreamDegraded(t *testing.T) {
	ns := natstest.Start(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FOREIGN", Subjects: []string{"kvgate.>"}}); err != nil {
		t.Fatal(err)
	}
	a := newKVEngine(t, "a", enginepub.VLLM)
	ing := startProxy(t, planeOf(kvConfig(t, KVConverged, a.spec(0, "vllm", "")), "ingest", ns.URL))
	waitFor(t, "ingest replica degraded on /debug/inventory", func() bool {
		return strings.HasPrefix(planeStates(t, ing)["a"], "ingest: degraded")
	})
	_, m := get(t, ing.admURL("/metrics"))
	if !strings.Contains(m, "kvgate_plane_ingest_publishing 0") {
		t.Fatalf("metrics do not show the ingest replica is not publishing:\n%s", grepLines(m, "plane"))
	}
}
