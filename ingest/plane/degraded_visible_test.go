package plane

import (
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/engine"
	"github.com/kvgate/kvgate/ingest"
)

// TestPlaneDownAtStartWarns: replicas started while nats-server is down are degraded from
// the start, and say so: a WARN from each role, and the route replica's endpoints show
// the outage (not "starting") until the server comes up.
func TestPlaneDownAtStartWarns(t *testing.T) {
	ns := startNATS(t)
	ns.Kill()
	var ilogs, rlogs logBuf
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a")
	icfg := pcfg
	icfg.Logger = ilogs.logger()
	ing := startIngest(t, icfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	waitSubscribed(t, pubs[0])
	rcfg := pcfg
	rcfg.Logger = rlogs.logger()
	r := startRoute(t, rcfg, peps)
	waitFor(t, "a WARN from the ingest replica", 5*time.Second, func() bool {
		return strings.Contains(ilogs.String(), "level=WARN")
	})
	waitFor(t, "a WARN from the route replica", 5*time.Second, func() bool {
		return strings.Contains(rlogs.String(), "level=WARN")
	})
	if st, why := r.r.State(0); st != StateDegraded || !strings.Contains(why, "plane down") {
		t.Fatalf("route replica state with no server: %s (%s)", st, why)
	}
	if r.metric(`kvgate_plane_route_state{endpoint="a"}`) != "2" {
		t.Fatal("metric does not show the route replica degraded")
	}
	ns.Start()
	l := newLoad(pubs)
	l.store(t, 0, 5)
	agree(t, "after the server started", 20*time.Second, l, ing, r)
}

// TestRouteNeverSyncedWarns: a route replica carries an endpoint no ingest replica
// publishes (a -plane-role mismatch of the fleets): it never gets a snapshot, routes on an
// empty inventory, and must say so (WARN, degraded state and metric), not stay "syncing"
// at INFO forever. The endpoint the ingest replica does publish is unaffected.
func TestRouteNeverSyncedWarns(t *testing.T) {
	ns := startNATS(t)
	var logs logBuf
	pcfg := testPlaneConfig(ns.URL)
	pubs, ieps, peps := vllmEndpoints(t, "a")
	ing := startIngest(t, pcfg, ingest.Config{Keys: ingest.KeysEngine}, ieps)
	waitSubscribed(t, pubs[0])
	rcfg := pcfg
	rcfg.Logger = logs.logger()
	r := startRoute(t, rcfg, append(peps, Endpoint{Name: "orphan", Index: 1, Engine: engine.VLLM}))
	l := newLoad(pubs)
	l.store(t, 0, 3)
	agree(t, "the published endpoint", 15*time.Second, l, ing, r)
	waitFor(t, "the orphan endpoint degraded", 15*time.Second, func() bool {
		st, _ := r.r.State(1)
		return st == StateDegraded
	})
	if r.metric(`kvgate_plane_route_state{endpoint="orphan"}`) != "2" {
		t.Fatal("metric does not show the orphan endpoint degraded")
	}
	if s := grepLog(logs.String(), "endpoint=orphan"); !strings.Contains(s, "level=WARN") {
		t.Fatalf("no WARN for the orphan endpoint:\n%s", s)
	}
	if st, _ := r.r.State(0); st != StateOK {
		t.Fatalf("published endpoint %s", st)
	}
}

func grepLog(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
