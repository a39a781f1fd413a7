package ingest

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kvgate/kvgate/bench/enginepub"
)

// Endpoints come and go while the Manager runs: an added one subscribes at once, a
// removed one stops (its publisher's later events change nothing) and its series leave
// the metrics set, so its name can come back in another slot with fresh gauges; the
// endpoint that stays is never touched.
func TestManagerAddRemoveAtRuntime(t *testing.T) {
	inv := newInv(t)
	set := metrics.NewSet()
	cfg := testConfig(inv)
	cfg.Metrics, cfg.Slots = set, 8
	pa := newPub(t, enginepub.Config{Endpoint: freeAddr(t, 1)})
	m := startManager(t, cfg, EndpointConfig{Name: "a", Index: 0, Engine: "vllm", Events: pa.Addr()})
	waitSubscribed(t, pa)
	pa.Publish(stored(1, 2, 3))
	waitFor(t, "a's keys", func() bool { return inv.Count(0) == 3 })

	pb := newPub(t, enginepub.Config{Endpoint: freeAddr(t, 1)})
	if err := m.AddEndpoint(EndpointConfig{Name: "b", Index: 1, Engine: "vllm", Events: pb.Addr()}); err != nil {
		t.Fatal(err)
	}
	waitSubscribed(t, pb)
	pb.Publish(stored(10, 11))
	waitFor(t, "b's keys", func() bool { return inv.Count(1) == 2 && m.Status(1).Connected })
	for _, bad := range []EndpointConfig{
		{Name: "b", Index: 2, Engine: "vllm", Events: pb.Addr()}, // name taken
		{Name: "c", Index: 0, Engine: "vllm", Events: pb.Addr()}, // slot taken
		{Name: "c", Index: 8, Engine: "vllm", Events: pb.Addr()}, // beyond the slots
	} {
		if err := m.AddEndpoint(bad); err == nil {
			t.Errorf("AddEndpoint(%+v) accepted", bad)
		}
	}

	m.RemoveEndpoint(1)()
	if st := m.Status(1); st.Name != "" || st.Connected {
		t.Fatalf("removed endpoint still reported: %+v", st)
	}
	var out bytes.Buffer
	set.WritePrometheus(&out)
	if strings.Contains(out.String(), `endpoint="b"`) {
		t.Fatalf("b's series outlived it:\n%s", out.String())
	}
	pb.Publish(stored(12)) // nobody follows b any more
	time.Sleep(100 * time.Millisecond)
	if inv.Count(1) != 2 {
		t.Fatalf("a removed endpoint's events still applied: %d keys", inv.Count(1))
	}
	inv.ClearEndpoint(1) // what the proxy does once the subscriber ended

	// b comes back in slot 2 (same name): its gauge reads slot 2, not the old one.
	pb2 := newPub(t, enginepub.Config{Endpoint: freeAddr(t, 1)})
	if err := m.AddEndpoint(EndpointConfig{Name: "b", Index: 2, Engine: "vllm", Events: pb2.Addr()}); err != nil {
		t.Fatal(err)
	}
	waitSubscribed(t, pb2)
	pb2.Publish(stored(20, 21, 22, 23))
	waitFor(t, "b's keys in slot 2", func() bool { return inv.Count(2) == 4 })
	out.Reset()
	set.WritePrometheus(&out)
	if !strings.Contains(out.String(), `kvgate_ingest_inventory_keys{endpoint="b"} 4`) {
		t.Errorf("b's gauge does not read its new slot:\n%s", out.String())
	}
	if inv.Count(0) != 3 || m.Status(0).Batches != 1 {
		t.Errorf("a was touched: %d keys, %+v", inv.Count(0), m.Status(0))
	}
}
